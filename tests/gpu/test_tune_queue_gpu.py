"""On a GPU: an untuned artifact stored by a CPU worker is tuned later by a GPU worker through the tune
queue, for real (triton.testing.do_bench over the candidates), its cubins rebuilt for the winners, and
the tuned artifact supersedes the untuned one and runs from its cubins, matching eager. Once with the
embedded store and a worker thread, once with real `python -m fxcc.worker` processes (CPU, then GPU) on a
real Redis (FXCC_TEST_REDIS_URL or redis-server on PATH; skipped without). Skipped without CUDA."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

REPO = Path(__file__).resolve().parents[2]


def _graph(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.cos(x) * 2, -1)


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(2048, 1024, device="cuda")]


def _request() -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target

    inputs = _inputs()
    with torch.no_grad():
        gm = make_fx(_graph, decomposition_table=decomposition_table())(*inputs)
    major, minor = torch.cuda.get_device_capability()
    options = CompileOptions(target=Target(kind="cuda", arch=major * 10 + minor))
    return CompileRequest(graph=capture_graph(gm, inputs).spec, options=options)


def _check_tuned_and_runs(untuned: Any, tuned: Any) -> None:
    from fxcc.client import cuda_loader
    from fxcc.client.runtime import cuda_arch_key, load_plan

    arch = cuda_arch_key()
    m = tuned.manifest
    assert m.tuned and not untuned.manifest.tuned and m.key == untuned.manifest.key and m.stats.tune_s > 0
    for k in m.kernels:
        rec = k.tuning
        assert rec is not None and rec.device == torch.cuda.get_device_name(), k.name
        assert rec.winner == min(rec.timings_ms, key=rec.timings_ms.__getitem__)
        assert len(rec.timings_ms) >= 2 and all(t > 0 for t in rec.timings_ms.values())
        assert arch in k.binaries and k.metadata[f"{arch}.num_warps"] == k.num_warps  # built for the winner
    fallbacks = cuda_loader.stats.jit_fallbacks
    inputs = _inputs()
    (got,) = load_plan(tuned)(inputs)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, _graph(*inputs), rtol=1e-4, atol=1e-4)
    assert cuda_loader.stats.jit_fallbacks == fallbacks  # ran from the tuned cubins


def test_a_gpu_worker_thread_tunes_what_a_cpu_worker_stored(tmp_path: Path) -> None:
    pytest.importorskip("redis")  # worker.loop's outage handling names redis-py's errors
    pytest.importorskip("pydantic_settings")  # the worker's settings
    from fxcc.compiler_core.keys import compile_key
    from fxcc.service.embedded_store import EmbeddedStore
    from fxcc.worker.loop import Consumer
    from fxcc.worker.process import JobPolicy, on_device, process_claim

    store = EmbeddedStore(tmp_path / "data")
    req = _request()
    key = compile_key(req)
    store.submit(key, req.model_dump_json(), "interactive")
    [claim] = store.claim("cpu", block_ms=100)  # a CPU worker: heuristic configs, untuned
    assert process_claim(store, claim, worker="cpu", policy=JobPolicy()).state.value == "done"  # type: ignore[union-attr]
    untuned = store.get_artifact(key)
    [job] = [j for j in store.list_jobs(None, 10) if j.kind == "tune"]
    assert untuned is not None and not untuned.manifest.tuned and job.state.value == "queued"

    policy = on_device(JobPolicy(), "cuda")
    assert policy.tune_arch == req.options.target.arch
    stop = threading.Event()
    consumer = Consumer(store, "gpu", stop, block_ms=100, policy=policy)
    consumer.thread.start()
    try:
        deadline = time.monotonic() + 300
        while not store.get_job(job.id).finished:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, store.get_job(job.id)
            time.sleep(0.1)
    finally:
        stop.set()
        consumer.thread.join(timeout=60)
    done = store.get_job(job.id)
    assert done is not None and done.state.value == "done" and done.worker == "gpu", done
    assert list(done.stages) == ["queued", "autotuning", "building", "storing", "done"]
    tuned = store.get_artifact(key)
    assert tuned is not None
    _check_tuned_and_runs(untuned, tuned)
    store.put_artifact(untuned)  # a late untuned put never replaces it
    assert store.get_manifest(key).tuned  # type: ignore[union-attr]


def _worker(env: dict[str, str], device: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fxcc.worker", "--device", device], cwd=REPO, env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


def test_worker_processes_on_redis_cpu_compiles_gpu_tunes(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not os.environ.get("FXCC_TEST_REDIS_URL") and shutil.which("redis-server") is None:
        pytest.skip("needs a Redis: FXCC_TEST_REDIS_URL or redis-server on PATH")
    pytest.importorskip("redis")
    pytest.importorskip("pydantic_settings")
    from fxcc.compiler_core.keys import compile_key
    from fxcc.service.redis_store import RedisStore
    from fxcc.service.settings import ServiceSettings

    redis_url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(FXCC_REDIS_URL=redis_url, FXCC_REDIS_PREFIX=prefix, FXCC_CLAIM_BLOCK_MS="200",
               FXCC_HEARTBEAT_S="0.5")
    store = RedisStore(ServiceSettings(redis_url=redis_url, redis_prefix=prefix))
    procs: list[subprocess.Popen] = []
    try:
        req = _request()
        key = compile_key(req)
        job_id = store.submit(key, req.model_dump_json(), "interactive").job_id
        procs.append(_worker(env, "cpu", tmp_path / "cpu.log"))
        _wait(lambda: store.get_job(job_id).finished, "the CPU worker's compile", tmp_path)  # type: ignore[union-attr]
        untuned = store.get_artifact(key)
        [tune] = [j for j in store.list_jobs(None, 10) if j.kind == "tune"]
        assert untuned is not None and not untuned.manifest.tuned and tune.state.value == "queued"

        procs.append(_worker(env, "cuda", tmp_path / "gpu.log"))
        _wait(lambda: store.get_job(tune.id).finished, "the GPU worker's tune job", tmp_path)  # type: ignore[union-attr]
        done = store.get_job(tune.id)
        assert done is not None and done.state.value == "done", done
        assert done.worker is not None and done.worker.endswith(f"-{procs[1].pid}")
        tuned = store.get_artifact(key)
        assert tuned is not None
        _check_tuned_and_runs(untuned, tuned)
        assert store.tune_depths() == {f"sm_{req.options.target.arch}": {"waiting": 0, "running": 0}}
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        store.close()
        for name in ("cpu.log", "gpu.log"):
            if (tmp_path / name).exists():
                sys.stderr.write(f"---- {name}\n{(tmp_path / name).read_text(errors='replace')[-3000:]}\n")


def _wait(predicate: Any, what: str, tmp_path: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
