"""`fxcc demo`: start a local service (embedded store + worker), compile the seed examples through
it from two fresh client processes, and print what happened to each graph."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the service at {url} was not ready after {timeout_s:.0f} s")


def client_pass(out: Path) -> None:
    """Run in a fresh process: compile each seed workload with backend="fxcc", compare with eager."""
    import torch

    from fxcc.client import backend
    from fxcc.client.examples import seed_workloads

    rows = []
    for w in seed_workloads("cpu", small=True):
        backend.clear_events()
        t0 = time.perf_counter()
        with torch.no_grad():
            expected = w.fn(*w.inputs)
            got = torch.compile(w.fn, backend="fxcc")(*w.inputs)
        first_call_s = time.perf_counter() - t0
        err = (got.float() - expected.float()).abs().max().item()
        for i, e in enumerate(backend.events()):
            s = e.stats
            rows.append({
                "workload": w.name, "graph": i, "key": e.key[:12], "source": e.source,
                "kernels": s.kernels if s else 0, "fused": s.ops_fused if s else 0,
                "extern": s.nodes_extern if s else e.graph_nodes, "max_abs_err": err,
                "compile_s": round(e.seconds, 3), "first_call_s": round(first_call_s, 3),
                "error": e.error,
            })
    out.write_text(json.dumps(rows))


def print_table(passes: list[tuple[str, list[dict]]]) -> None:
    header = f"{'pass':22} {'workload':22} {'graph':>5} {'kernels':>7} {'fused':>5} {'extern':>6} " \
             f"{'cache':16} {'max|err|':>9} {'compile s':>9}"
    print(header)
    print("-" * len(header))
    for name, rows in passes:
        for r in rows:
            cache = {"remote-compiled": "miss (compiled)", "remote-hit": "hit (shared)",
                     "local-hit": "hit (local)"}.get(r["source"], r["source"])
            print(f"{name:22} {r['workload']:22} {r['graph']:>5} {r['kernels']:>7} {r['fused']:>5} "
                  f"{r['extern']:>6} {cache:16} {r['max_abs_err']:>9.2e} {r['compile_s']:>9.3f}")
            if r.get("error"):
                print(f"{'':22} fell back to eager: {r['error']}")


def main(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fxcc-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(TRITON_INTERPRET="1", FXCC_DATA_DIR=str(workdir / "service"))
    print(f"fxcc demo: starting the service (embedded store and worker) at {url}; data in {workdir}")
    log = open(workdir / "service.log", "w")  # noqa: SIM115 - lives as long as the server
    server = subprocess.Popen([sys.executable, "-m", "fxcc.client.cli", "serve", "--port", str(port)],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, server)
        passes = []
        for name, cache in (("1: new client", "client-a"), ("2: new machine", "client-b")):
            out = workdir / f"{cache}.json"
            cenv = dict(env, FXCC_URL=url, FXCC_CACHE_DIR=str(workdir / cache))
            subprocess.run([sys.executable, "-m", "fxcc.client.demo", "--client-pass", str(out)],
                           env=cenv, check=True)
            passes.append((name, json.loads(out.read_text())))
        print()
        print_table(passes)
        second = [r["source"] for r in passes[1][1]]
        if second and all(src == "remote-hit" for src in second):
            print("\npass 2 ran in a new process with an empty local cache: every graph came from "
                  "the service's shared cache, with no new compile job.")
        else:
            print(f"\npass 2 was not served entirely from the shared cache: {second}")
            return 1
    finally:
        stop(server, 10)
        log.close()
    return 0


def stop(proc: subprocess.Popen, wait_s: float) -> None:
    """SIGTERM, then SIGKILL if `proc` has not gone after `wait_s`."""
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client-pass":
        client_pass(Path(sys.argv[2]))
    else:
        sys.exit(main(argparse.Namespace(workdir=None)))
