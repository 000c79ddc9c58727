"""Cold first calls through a Redis cluster of 1, 4 and 8 CPU workers, against Inductor's cold compile (issue 25).

    python -m bench.cold_workers --out $OUT                     # the GPU machine, under 9 minutes
    TRITON_INTERPRET=1 python -m bench.cold_workers --out /tmp/cw --device cpu --smoke   # CPU check

Per workload (`gpt2_48`: transformers' GPT2LMHeadModel with 48 layers, batch 4 × 512 tokens, use_cache
off; `convnet`: timm's resnet50 (torchvision's when timm is not installed; the row's `model` says
which), batch 32 at 224²; `encoder`: transformers' BertModel (base), batch 8 × 512), every run a
fresh process with empty caches:
- Inductor cold: torch.compile(model) with empty TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR (it
  compiles its kernels in its own pool of subprocesses);
- for each N of --workers: a fresh redis-server (from PATH, else the carried Debian packages under
  .gpu-redis/: bench/README.md), `fxcc serve` on it (the API only), N `fxcc worker --device cpu`
  with FXCC_BUILD_PROCESSES=--build-processes each and empty Triton caches, signing with one key;
  once every worker's compile and build processes are warm (their heartbeats say so), a fresh
  client (empty local cache, FXCC_URL, trusting that key, FXCC_FALLBACK=error) times its first call.
Times run from torch.compile(...) to the synchronized result (imports and model construction
before). Each row: workload, workers, build_processes, fxcc_cold_s, inductor_cold_s and their
ratio, the build tasks the cluster ran (how many, on how many build processes, kept kernels
reused), the graphs and where they came from, outputs_match against eager, errors, and each first
call's split: `*_backend_s` (in the backend: for fxcc AOTAutograd, `fxcc_aot_s`, plus `fxcc_own_s`,
capture to loaded plan with the service's compile; for Inductor AOTAutograd plus its compile) and
`*_dynamo_s` (the rest: Dynamo's tracing, guards and bytecode, and the first run of the graphs).
`--smoke` runs CPU-sized models (fxcc's own TransformerBlock stack and Bottleneck, a small encoder)
with 1 and 2 workers, to check the script without a GPU. Writes OUT/<tag>-cold.json (tag h200).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Self

from fxcc.service.keys import RedisKeys

REPO = Path(__file__).resolve().parents[1]
KEYS = RedisKeys("fxcc:")  # the clusters' prefix (FXCC_REDIS_PREFIX's default)
WORKLOADS = ("gpt2_48", "convnet", "encoder")


# ---------------------------------------------------------------- one first call (a child process)


def build(workload: str, smoke: bool, device: str) -> tuple[Any, tuple[Any, ...], str]:
    """(model, inputs, what the model is) on `device`, eval mode, seeded."""
    import torch

    torch.manual_seed(0)
    if smoke:
        from fxcc.client.examples import Bottleneck, TransformerBlock

        if workload == "gpt2_48":
            stack = torch.nn.Sequential(*[TransformerBlock(64, 4) for _ in range(4)])
            return stack.eval(), (torch.randn(2, 16, 64),), "4 fxcc TransformerBlocks (smoke)"
        if workload == "convnet":
            return Bottleneck(32, 8, 2).eval(), (torch.randn(2, 32, 8, 8),), "fxcc Bottleneck (smoke)"
        return TransformerBlock(32, 2).eval(), (torch.randn(2, 8, 32),), "fxcc TransformerBlock (smoke)"
    if workload == "gpt2_48":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=48, use_cache=False))
        return model.to(device).eval(), (torch.randint(0, 50257, (4, 512), device=device),), "GPT2LMHeadModel n_layer=48"
    if workload == "convnet":
        x = torch.randn(32, 3, 224, 224, device=device)
        try:
            import timm

            return timm.create_model("resnet50").to(device).eval(), (x,), "timm resnet50"
        except ImportError:
            import torchvision

            return torchvision.models.resnet50().to(device).eval(), (x,), "torchvision resnet50 (timm not installed)"
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig())
    return model.to(device).eval(), (torch.randint(0, 30522, (8, 512), device=device),), "BertModel base"


def _first_tensor(out: Any) -> Any:
    for name in ("logits", "last_hidden_state"):
        if hasattr(out, name):
            return getattr(out, name)
    return out[0] if isinstance(out, (tuple, list)) else out


def run_one(workload: str, compiler: str, smoke: bool, device: str) -> dict[str, Any]:
    """One first call in this (fresh) process."""
    import importlib

    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model, inputs, what = build(workload, smoke, device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    importlib.import_module("torch._dynamo")
    importlib.import_module("torch._dynamo.repro.after_dynamo")  # torch.compile imports it for every backend
    backend_s = [0.0]  # in the backend: AOTAutograd and the compiler (fxcc's own time included)
    if compiler == "fxcc":
        importlib.import_module("fxcc.client.remote")
        # Note: timed inside fxcc's backend, which Dynamo gets by its name as a user's call does
        # (a wrapped backend would get no Dynamo package, whose saving a cold call pays).
        backend_mod = importlib.import_module("fxcc.client.backend")
        for name in ("_pre_aot", "_run_aot"):
            setattr(backend_mod, name, _timed(getattr(backend_mod, name), backend_s))
        backend: Any = "fxcc"
    else:
        from torch._inductor.compile_fx import compile_fx

        backend = _timed(compile_fx, backend_s)
    t0 = time.perf_counter()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        out = _first_tensor(compiled(*inputs)).float()
        sync()
        first_call_s = time.perf_counter() - t0
        expected = _first_tensor(model(*inputs)).float()
    tol = 2e-2 if device.startswith("cuda") else 1e-3  # TF32 on both sides on a GPU
    res: dict[str, Any] = {"first_call_s": round(first_call_s, 3), "model": what,
                           "outputs_match": bool(torch.allclose(out, expected, atol=tol, rtol=tol)),
                           "max_abs_err": float((out - expected).abs().max())}
    res.update(dynamo_s=round(first_call_s - backend_s[0], 3), backend_s=round(backend_s[0], 3))
    if compiler == "fxcc":
        from fxcc.client import backend as fxcc

        own = sum(e.seconds for e in fxcc.events())
        res.update(sources=sorted({e.source for e in fxcc.events()}), graphs=len(fxcc.events()),
                   fxcc_own_s=round(own, 3), aot_s=round(max(0.0, backend_s[0] - own), 3))
    return res


def _timed(fn: Any, total: list[float]) -> Any:
    """`fn`, its calls' seconds added to total[0]."""
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - t0
    return timed


def child(args: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """One first call in a fresh `python -m bench.cold_workers run` (its output goes to bench.run's log)."""
    from bench.run import _python

    got, err = _python(["bench.cold_workers", "run", *args], env, timeout_s)
    return {"error": err} if got is None or err else got


# ---------------------------------------------------------------- the cluster


def redis_command(port: int, folder: Path) -> tuple[list[str], dict[str, str]]:
    """redis-server from PATH, else from the carried Debian packages under .gpu-redis/."""
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)]
    exe = shutil.which("redis-server")
    if exe:
        return [exe, *args], {}
    carried = REPO / ".gpu-redis"
    exe_path = carried / "usr" / "bin" / "redis-server"
    if not exe_path.exists():
        raise RuntimeError("no redis-server on PATH nor under .gpu-redis/ (bench/README.md says how to carry it)")
    return [str(exe_path), *args], {"LD_LIBRARY_PATH": str(carried / "usr" / "lib" / "x86_64-linux-gnu")}


class Cluster:
    """A fresh redis-server, `fxcc serve` on it and `workers` CPU workers, stopped on exit."""

    def __init__(self, root: Path, workers: int, build_processes: int, base_env: dict[str, str]) -> None:
        self.root, self.workers, self.build_processes, self.base = root, workers, build_processes, base_env
        self.token = secrets.token_hex(16)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stack = ExitStack()

    def __enter__(self) -> Self:
        try:
            self._start_all()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start_all(self) -> None:
        from fxcc.client.demo import free_port, wait_healthy
        from fxcc.compiler_core.signing import write_key_pair

        self.root.mkdir(parents=True, exist_ok=True)
        key = self.root / "signing.key"
        write_key_pair(key, key.with_name("signing.key.pub"))
        self.public_key = key.with_name("signing.key.pub")
        redis_port, port = free_port(), free_port()
        self.redis_url = f"redis://127.0.0.1:{redis_port}/0"
        self.url = f"http://127.0.0.1:{port}"
        cmd, extra = redis_command(redis_port, self.root)
        self._start("redis", cmd, dict(self.base, **extra))
        self._wait(lambda: self._redis().ping(), 20, "redis-server")
        env = dict(self.base, FXCC_REDIS_URL=self.redis_url, FXCC_TOKEN=self.token, FXCC_SIGNING_KEY_FILE=str(key),
                   FXCC_HEARTBEAT_S="0.5",
                   FXCC_BUILD_PROCESSES=str(self.build_processes), FXCC_DATA_DIR=str(self.root / "service"))
        server = self._start("serve", [sys.executable, "-m", "fxcc.client.cli", "serve", "--port", str(port)], env)
        for i in range(self.workers):
            self._start(f"worker{i}", [sys.executable, "-m", "fxcc.worker", "--device", "cpu"],
                        dict(env, TRITON_CACHE_DIR=str(self.root / f"worker{i}-triton")))
        wait_healthy(self.url, server, timeout_s=120.0)
        self._wait(self._all_warm, 240, f"{self.workers} warm workers")

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.redis_url)

    def _start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = self.stack.enter_context((self.root / f"{name}.log").open("wb"))
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        self.procs.append(proc)
        return proc

    def _wait(self, check: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # not up yet
                if check():
                    return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        raise RuntimeError(f"{what}: not there within {timeout_s:g} s (logs under {self.root})")

    def _all_warm(self) -> bool:
        """Every worker's heartbeat says all of its compile and build processes are ready."""
        r = self._redis()
        ids = [i.decode() for i in r.zrange(KEYS.live_workers, 0, -1)]
        infos = [json.loads(v) for v in r.mget([KEYS.worker(i) for i in ids]) if v] if ids else []
        return len(infos) == self.workers and all(i.get("ready") == i.get("processes") for i in infos)

    def empty(self) -> None:
        """Forget every compile: Redis flushed (artifacts, kept kernels, jobs; the workers make their
        streams again), the workers' Triton caches emptied; then wait for every worker's heartbeat
        again. The workers and their warm processes stay: what a fresh cluster would have."""
        self._redis().flushdb()
        for folder in self.root.glob("worker*-triton"):
            shutil.rmtree(folder, ignore_errors=True)
        self._wait(self._all_warm, 60, f"{self.workers} warm workers after emptying")

    def client_env(self, run: Path) -> dict[str, str]:
        return dict(self.base, FXCC_URL=self.url, FXCC_TOKEN=self.token, FXCC_FALLBACK="error", FXCC_BLOCKING="1",
                    FXCC_TRUSTED_KEYS=str(self.public_key), FXCC_CACHE_DIR=str(run / "fxcc"),
                    TRITON_CACHE_DIR=str(run / "triton"), TORCHINDUCTOR_CACHE_DIR=str(run / "inductor"))

    def job_summary(self) -> dict[str, Any]:
        """Where the cluster's time went since it was emptied: its compile jobs (how many; seconds queued, lowering and
        waiting on build tasks, summed) and their build tasks (how many, on how many build processes
        and workers, retries, the summed build time)."""
        from fxcc.service.redis_store import RedisStore
        from fxcc.service.settings import ServiceSettings

        store = RedisStore(ServiceSettings(redis_url=self.redis_url))
        try:
            jobs = [j for j in store.list_jobs(None, 1000) if j.kind == "compile"]
            tasks = [t for t in store.get_jobs([t for j in jobs for t in j.tasks]) if t is not None]
        finally:
            store.close()

        def spent(job: Any, stage: str) -> float:
            """Seconds from entering `stage` to entering the next one."""
            t = job.stages.get(stage)
            later = [v for v in job.stages.values() if t is not None and v > t]
            return min(later) - t if later else 0.0

        workers = {t.worker for t in tasks if t.worker}
        return {"compile_jobs": len(jobs), "queued_s": round(sum(spent(j, "queued") for j in jobs), 3),
                "lowering_s": round(sum(spent(j, "lowering") for j in jobs), 3),
                "building_s": round(sum(spent(j, "building") for j in jobs), 3),
                "build_tasks": len({t.id for t in tasks}), "build_processes_used": len(workers),
                "workers_used": len({w.rsplit("-b", 1)[0] for w in workers}),
                "task_retries": sum(t.attempt - 1 for t in tasks if t.attempt),
                "task_build_s": round(sum((t.stats or {}).get("build_ms") or 0 for t in tasks) / 1000, 3)}

    def __exit__(self, *exc: object) -> None:
        from fxcc.client.demo import stop

        for proc in reversed(self.procs):
            stop(proc, 15)
        self.stack.close()


# ---------------------------------------------------------------- the bench


def bench(workloads: list[str], worker_counts: list[int], build_processes: int, smoke: bool, device: str,
          root: Path, timeout_s: float) -> list[dict[str, Any]]:
    """Inductor cold per workload, then per worker count one cluster that compiles every workload,
    emptied between them (Cluster.empty)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FXCC_", "TORCHINDUCTOR_", "TRITON_CACHE"))}
    base["PYTHONUNBUFFERED"] = "1"
    args = {w: ["--workload", w, "--device", device, *(["--smoke"] if smoke else [])] for w in workloads}
    inductor = {w: child([*args[w], "--compiler", "inductor"],
                         dict(base, TORCHINDUCTOR_CACHE_DIR=str(root / w / "inductor"),
                              TRITON_CACHE_DIR=str(root / w / "inductor-triton")), timeout_s) for w in workloads}
    rows = []
    for n in worker_counts:
        runs: dict[str, dict[str, Any]] = {}
        try:
            with Cluster(root / f"cluster{n}", n, build_processes, base) as cluster:
                for w in workloads:
                    cluster.empty()
                    runs[w] = child([*args[w], "--compiler", "fxcc"], cluster.client_env(root / w / f"client{n}"),
                                    timeout_s)
                    runs[w]["cluster"] = cluster.job_summary()
        except RuntimeError as e:
            runs = {w: runs.get(w) or {"error": str(e)} for w in workloads}
        for w in workloads:
            rows.append(_row(w, n, build_processes, inductor[w], runs[w]))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _row(workload: str, n: int, build_processes: int, inductor: dict[str, Any], fxcc: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": workload, "workers": n, "build_processes": build_processes,
                           "fxcc_cold_s": fxcc.get("first_call_s"), "inductor_cold_s": inductor.get("first_call_s"),
                           "model": inductor.get("model") or fxcc.get("model")}
    if row["fxcc_cold_s"] and row["inductor_cold_s"]:
        row["fxcc_over_inductor"] = round(row["fxcc_cold_s"] / row["inductor_cold_s"], 3)
    row.update(fxcc.get("cluster", {}))
    row.update({k: fxcc[k] for k in ("sources", "graphs", "fxcc_own_s", "outputs_match", "max_abs_err") if k in fxcc})
    # where each first call went: in the backend (AOTAutograd and the compiler), and the rest (Dynamo)
    row.update({f"fxcc_{k}": fxcc[k] for k in ("dynamo_s", "aot_s", "backend_s") if k in fxcc})
    row.update({f"inductor_{k}": inductor[k] for k in ("dynamo_s", "backend_s") if k in inductor})
    if "error" in fxcc:
        row["fxcc_error"] = fxcc["error"]
    if "error" in inductor:
        row["inductor_error"] = inductor["error"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="where <tag>-cold.json and logs/ go")
    run = p.add_subparsers(dest="cmd").add_parser("run", help="one first call in this process (the parent runs these)")
    run.add_argument("--compiler", choices=("fxcc", "inductor"), required=True)
    run.add_argument("--workload", choices=WORKLOADS, required=True)
    run.add_argument("--device", default="cuda")
    run.add_argument("--smoke", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true", help="CPU-sized models, 1 and 2 workers (set TRITON_INTERPRET=1)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--workers", default=None, help="worker counts, comma-separated (default 1,4,8; --smoke 1,2)")
    p.add_argument("--build-processes", type=int, default=2, help="build processes per worker")
    p.add_argument("--tag", default="h200")
    p.add_argument("--timeout-s", type=float, default=240.0, help="per client process")
    a = p.parse_args()
    if a.cmd == "run":
        print(json.dumps(run_one(a.workload, a.compiler, a.smoke, a.device)))
        return
    if a.out is None:
        p.error("--out is required")
    counts = [int(n) for n in (a.workers or ("1,2" if a.smoke else "1,4,8")).split(",")]
    (a.out / "logs").mkdir(parents=True, exist_ok=True)
    from bench.run import LOG

    LOG[:] = [a.out / "logs" / "cold-runs.log"]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fxcc-bench-cold-") as tmp:
        rows = bench(a.workloads.split(","), counts, a.build_processes, a.smoke, a.device, Path(tmp), a.timeout_s)
        for log in Path(tmp).glob("cluster*/*.log"):  # the clusters' own logs, tails
            (a.out / "logs" / f"cold-{log.parent.name}-{log.name}").write_text(log.read_text()[-100_000:])
    path = a.out / f"{a.tag}-cold.json"
    path.write_text(json.dumps({"bench": "cold_workers", "wall_s": round(time.monotonic() - t0, 1),
                                "build_processes_per_worker": a.build_processes, "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
