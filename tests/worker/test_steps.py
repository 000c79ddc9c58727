"""worker/steps.py: the host-wide GPU tuning lock serialises holders that open it separately (as the
compile processes of one host do), and a holder's death releases it."""

from __future__ import annotations

import subprocess
import sys
import threading

from fxcc.worker.steps import gpu_tuning_lock


def test_the_tuning_lock_of_one_gpu_admits_one_holder_at_a_time() -> None:
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def first() -> None:
        with gpu_tuning_lock("cuda:7"):
            order.append("first in")
            inside.set()
            release.wait(30)
            order.append("first out")

    holder = threading.Thread(target=first)
    holder.start()
    assert inside.wait(30)
    def then() -> None:
        with gpu_tuning_lock("cuda:7"):
            order.append("second in")

    second = threading.Thread(target=then)
    second.start()
    second.join(0.5)
    assert second.is_alive() and order == ["first in"]  # waiting for the first
    with gpu_tuning_lock("cuda:6"):  # another GPU's lock is free
        order.append("other gpu")
    release.set()
    holder.join(30)
    second.join(30)
    assert order == ["first in", "other gpu", "first out", "second in"]


def test_a_killed_holder_releases_the_lock() -> None:
    script = ("from fxcc.worker.steps import gpu_tuning_lock; import sys, time\n"
              "with gpu_tuning_lock('cuda:5'):\n    print('held', flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        proc.kill()
        proc.wait(30)
        got = threading.Event()

        def take() -> None:
            with gpu_tuning_lock("cuda:5"):
                got.set()

        threading.Thread(target=take, daemon=True).start()
        assert got.wait(30)
    finally:
        proc.kill()
