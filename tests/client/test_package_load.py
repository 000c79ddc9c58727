"""A Dynamo package's load (client/package_load.py's PackageLoad): its side thread fetches the
artifacts and builds the plans while torch builds the package's guards, not after; what fails there
is a miss (Dynamo traces, one message per cause); what the load writes to the local cache (artifacts
fetched from the service, the package) is written after the first call, not before it.

Real processes (tests/client/package_load_child.py, the package cache on): an `fxcc serve` with its
embedded store and worker; one process compiles through it and saves (locally and on the service);
the others load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fxcc.client.demo import free_port, stop, wait_healthy

CHILD = Path(__file__).with_name("package_load_child.py")
REPO = Path(__file__).parents[2]


def _child(phase: str, env: dict[str, str], **extra: str) -> dict:
    out = subprocess.run([sys.executable, str(CHILD), phase], env=dict(env, **extra), cwd=REPO, capture_output=True,
                         text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path, dict]]:
    root = tmp_path_factory.mktemp("package-load")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(FXCC_PACKAGE_KEY_FILE=str(root / "principal" / "package.key"), FXCC_DYNAMO_CACHE="1",
               TRITON_INTERPRET="1", FXCC_FALLBACK="error",
               PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)])))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (root / "service.log").open("w") as log:
        server = subprocess.Popen([sys.executable, "-m", "fxcc.client.cli", "serve", "--port", str(port)],
                                  env=dict(env, FXCC_DATA_DIR=str(root / "service")), cwd=REPO, stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, server, timeout_s=120.0)
            env.update(FXCC_URL=url, FXCC_TRUSTED_KEYS=str(root / "service" / "keys" / "signing.pub"))
            out = _child("save", env, FXCC_CACHE_DIR=str(root / "machine-a"))
            yield env, root, out
        finally:
            stop(server, 15)


def test_the_side_thread_builds_the_plans_while_the_guards_are_built(saved):
    env, root, first = saved
    assert first["net"] == 1 and first["counters"]["saved"] == 3
    out = _child("side", env, FXCC_CACHE_DIR=str(root / "machine-a"))
    assert (out["traced"], out["graphs"]) == (0, 1)  # no tracing; the one graph loaded from the package
    assert out["counters"] == {"hits": 1}
    assert out["plan_threads"] == ["fxcc-package-load"]  # not the caller's thread
    assert out["built_during_guards"] and all(out["built_during_guards"])  # never waited WAIT_S for it
    timings = out["timings"]
    for name in ("fetch_s", "plans_s", "ready_s", "ready_wait_s", "plans_wait_s", "total_s", "cubins"):
        assert name in timings, name
    assert timings["plans_s"] > 0 and timings["ready_s"] > 0 and timings["cubins"] == 0  # no GPU here


def test_an_error_on_the_side_thread_traces_with_one_message(saved):
    env, root, _ = saved
    out = _child("error", env, FXCC_CACHE_DIR=str(root / "machine-a"))
    # each package verified and installed, its plan failed on the side thread: uninstalled, traced
    assert (out["failing_one"], out["failing_two"]) == (1, 1)
    assert out["threads"] == ["fxcc-package-load", "fxcc-package-load"]
    assert out["counters"]["errors"] == 2 and "hits" not in out["counters"]
    assert len(out["messages"]) == 1 and "tracing as usual" in out["messages"][0]


def test_the_local_cache_is_written_after_the_first_call(saved):
    env, root, _ = saved
    out = _child("deferred", env, FXCC_CACHE_DIR=str(root / "machine-b"))  # a new machine: empty local cache
    assert out["traced"] == 0 and out["sources"] == ["remote-hit"] and out["counters"] == {"hits": 1}
    assert out["before"] == {"artifacts": 0, "packages": 0}  # loaded, nothing written yet
    assert out["joined"] and out["after"] == {"artifacts": 1, "packages": 1}  # written once the call returned
    again = _child("side", env, FXCC_CACHE_DIR=str(root / "machine-b"))
    assert again["traced"] == 0 and again["counters"] == {"hits": 1} and again["sources"] == ["local-hit"]


def test_module_of_a_frames_code_is_the_module_whose_globals_it_is_installed_into():
    import types

    from fxcc.client import dynamo_identity
    from tests.client import dynamo_skip_decorators as decorators

    code = decorators.as_tuple.__code__
    assert dynamo_identity.module_of(code, vars(decorators)) is decorators
    assert dynamo_identity.module_of(code, vars(types)) is decorators  # another module's scope: found by file
    assert dynamo_identity.module_of(code) is decorators
