"""Time to the first training step on every rank of a DDP job: fxcc cold and warm from the shared
cache against Inductor with its Redis remote caches, in one run (issue 23).

    python -m bench.ranks --out $OUT                         # the GPU machine: 2 ranks; <tag>-ranks.json
    python -m bench.ranks --out $OUT --ranks 4 --tag h200x4  # a machine of 4 GPUs
    TRITON_INTERPRET=1 python -m bench.ranks --out /tmp/r --smoke   # CPU check, small model, gloo

The job (each rank a process of `torchrun`, the model DistributedDataParallel): transformers'
GPT2LMHeadModel with 6 layers (random weights), batch 4 x 512 tokens per rank, one training step
(forward, loss, backward, AdamW). Each rank is on GPU LOCAL_RANK % the GPUs there are: NCCL when
every rank has a GPU of its own, else gloo on CUDA tensors (NCCL refuses two ranks on one GPU; the
row says which ran). One cluster for the run (bench/cold_workers.py's Cluster: a fresh redis-server,
`fxcc serve` on it, --workers CPU workers building cubins for the GPU's arch), then four jobs:
- fxcc cold: the cluster emptied, every rank an empty local cache (`fxcc_cold_s`);
- fxcc warm: every rank another empty local cache; the cluster holds what the cold job compiled
  (`fxcc_warm_s`: artifacts, pre-AOT entries and Dynamo packages are not per machine);
- Inductor cold: TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE, _AUTOGRAD_REMOTE_CACHE and
  _AUTOTUNE_REMOTE_CACHE on, on the same redis-server; every rank empty local caches (its own
  TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR) (`inductor_cold_s`);
- Inductor warm: other empty local caches, the remote caches filled by the cold job (`inductor_warm_s`).
Times run from torch.compile(...) to the first step's end (synchronized) on each rank; the row has
each rank's and the slowest (the job waits for it), and each rank's cache counters (Inductor's
fxgraph / autograd cache hits and misses say whether its remote caches served the warm job). The first step's loss is checked against eager's
from the same weights on that rank (`losses_match`, TF32 on everywhere: within 1e-2 relative).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RUNS = ("fxcc_cold", "fxcc_warm", "inductor_cold", "inductor_warm")


# ---------------------------------------------------------------- one rank (under torchrun)


def _rank_caches(rank: int) -> None:
    """This rank's own local caches, under BENCH_CACHE_ROOT (set before torch is imported)."""
    root = os.environ.get("BENCH_CACHE_ROOT")
    if root:
        mine = Path(root) / f"rank{rank}"
        os.environ.update(FXCC_CACHE_DIR=str(mine / "fxcc"), TORCHINDUCTOR_CACHE_DIR=str(mine / "inductor"),
                          TRITON_CACHE_DIR=str(mine / "triton"))


def build(smoke: bool, device: Any) -> tuple[Any, Any, Any]:
    """(model, input ids or inputs, labels) for one rank, seeded alike on every rank."""
    import torch

    torch.manual_seed(0)
    if smoke:
        from fxcc.client.examples import TransformerBlock

        model = torch.nn.Sequential(TransformerBlock(32, 2), TransformerBlock(32, 2), torch.nn.Linear(32, 8))
        x = torch.randn(2, 8, 32)
        return model.to(device), x.to(device), torch.randint(0, 8, (2, 8)).to(device)
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=6, use_cache=False)).to(device)
    ids = torch.randint(0, 50257, (4, 512), device=device)
    return model, ids, ids


def _loss(model: Any, x: Any, y: Any, smoke: bool) -> Any:
    import torch

    if smoke:
        out = model(x)
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return model(input_ids=x, labels=y).loss


def run_rank(compiler: str, smoke: bool, out: Path) -> None:
    rank = int(os.environ["RANK"])
    _rank_caches(rank)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cuda = torch.cuda.is_available() and not smoke
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()) if cuda \
        else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    world = int(os.environ["WORLD_SIZE"])
    backend = "nccl" if cuda and torch.cuda.device_count() >= world else "gloo"
    dist.init_process_group(backend)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model, x, y = build(smoke, device)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    import torch._dynamo

    if compiler == "fxcc":
        import fxcc.client.backend
        import fxcc.client.remote  # noqa: F401
    dist.barrier()
    sync()
    t0 = time.perf_counter()
    compiled = torch.compile(ddp, backend="fxcc" if compiler == "fxcc" else "inductor")
    loss = _loss(compiled, x, y, smoke)
    loss.backward()
    opt.step()
    sync()
    first_step_s = time.perf_counter() - t0
    got = float(loss)
    fresh, x2, y2 = build(smoke, device)  # eager's first loss from the same weights and batch
    want = float(_loss(fresh, x2, y2, smoke))
    row: dict[str, Any] = {"rank": rank, "world": world, "backend": backend, "device": str(device),
                           "first_step_s": round(first_step_s, 3), "loss": got, "eager_loss": want,
                           "losses_match": abs(got - want) <= 1e-2 * max(1.0, abs(want))}
    from torch._dynamo.utils import counters

    # whether Inductor's caches (local and remote) were hit: fxgraph_cache_hit, autograd_cache_hit, ...
    row["cache_counters"] = {f"{group}.{k}": v for group in ("inductor", "aot_autograd")
                             for k, v in counters[group].items() if "cache" in k}
    if compiler == "fxcc":
        from fxcc.client.backend import events

        row["sources"] = sorted({e.source for e in events()})
        row["graphs"] = len(events())
    Path(out, f"rank{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


# ---------------------------------------------------------------- the bench


def job(compiler: str, ranks: int, smoke: bool, env: dict[str, str], out: Path, timeout_s: float) -> dict[str, Any]:
    """One torchrun job of `ranks` processes: each rank's report, or why there is none."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node",
           str(ranks), "-m", "bench.ranks", "rank", "--compiler", compiler, "--job-out", str(out),
           *(["--smoke"] if smoke else [])]
    try:
        p = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    (out / "job.log").write_text(p.stdout[-50_000:] + "\n" + p.stderr[-50_000:])
    reports = [json.loads(f.read_text()) for f in sorted(out.glob("rank*.json"))]
    if p.returncode != 0 or len(reports) != ranks:
        tail = (p.stderr or p.stdout).strip().splitlines()
        return {"error": f"exit {p.returncode}: {tail[-1] if tail else 'no output'}", "ranks": reports}
    return {"ranks": reports, "slowest_s": max(r["first_step_s"] for r in reports),
            "losses_match": all(r["losses_match"] for r in reports)}


def bench(ranks: int, workers: int, smoke: bool, root: Path, timeout_s: float, compilers: list[str]) -> dict[str, Any]:
    from bench.cold_workers import Cluster

    base = {k: v for k, v in os.environ.items() if not k.startswith(("FXCC_", "TORCHINDUCTOR_", "TRITON_CACHE"))}
    base.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1"))
    row: dict[str, Any] = {"workload": "smoke TransformerBlocks" if smoke else "transformers GPT2LMHeadModel n_layer=6 DDP",
                           "ranks": ranks, "workers": workers}
    with Cluster(root / "cluster", workers, 2, base) as cluster:
        redis_port = cluster.redis_url.rsplit(":", 1)[1].split("/")[0]
        for run in RUNS:
            compiler = run.split("_")[0]
            if compiler not in compilers:
                continue
            caches = root / run / "caches"
            if compiler == "fxcc":
                if run == "fxcc_cold":
                    cluster.empty()
                env = dict(cluster.client_env(root / run), BENCH_CACHE_ROOT=str(caches))
            else:
                env = dict(base, BENCH_CACHE_ROOT=str(caches), TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE="1",
                           TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE="1", TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE="1",
                           TORCHINDUCTOR_REDIS_HOST="127.0.0.1", TORCHINDUCTOR_REDIS_PORT=redis_port)
            row[run] = job(compiler, ranks, smoke, env, root / run / "out", timeout_s)
            row[f"{run}_s"] = row[run].get("slowest_s")
            print(json.dumps({run: row[run]}), flush=True)
        if {"fxcc", "inductor"} <= set(compilers):
            for phase in ("cold", "warm"):
                f, i = row.get(f"fxcc_{phase}_s"), row.get(f"inductor_{phase}_s")
                if f and i:
                    row[f"fxcc_over_inductor_{phase}"] = round(f / i, 3)
        row["cluster"] = cluster.job_summary()
    row["backend"] = next((r["backend"] for run in RUNS for r in row.get(run, {}).get("ranks", [])), None)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("rank", help="one rank (torchrun runs these)")
    r.add_argument("--compiler", choices=("fxcc", "inductor"), required=True)
    r.add_argument("--job-out", type=Path, required=True)
    r.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, help="where <tag>-ranks.json and logs/ go")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="CPU workers of the cluster")
    p.add_argument("--smoke", action="store_true", help="a small model on CPU ranks (set TRITON_INTERPRET=1)")
    p.add_argument("--compilers", default="fxcc,inductor")
    p.add_argument("--tag", default="h200")
    p.add_argument("--timeout-s", type=float, default=400.0, help="per job")
    a = p.parse_args()
    if a.cmd == "rank":
        run_rank(a.compiler, a.smoke, a.job_out)
        return
    if a.out is None:
        p.error("--out is required")
    (a.out / "logs").mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fxcc-bench-ranks-") as tmp:
        row = bench(a.ranks, a.workers, a.smoke, Path(tmp), a.timeout_s, a.compilers.split(","))
        for log in [*Path(tmp).glob("*/out/job.log"), *Path(tmp).glob("cluster/*.log")]:
            (a.out / "logs" / f"ranks-{log.parent.parent.name if log.name == 'job.log' else 'cluster'}-{log.name}") \
                .write_text(log.read_text()[-100_000:])
    path = a.out / f"{a.tag}-ranks.json"
    path.write_text(json.dumps({"bench": "ranks", "wall_s": round(time.monotonic() - t0, 1), "rows": [row]},
                               indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
