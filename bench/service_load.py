"""Cache-hit throughput of the service: GET /v1/artifacts/{key} with 64 connections, beside
`redis-benchmark -t get -c 64` against the same Redis on the same machine in the same run.

`python -m bench.service_load [--seconds 10] [--connections 64] [--processes 1] [--clients 4]`
starts its own redis-server on a free port, stores one compiled artifact, starts the API
(`fxcc serve` with --processes API processes), drives it with --clients load
processes (asyncio, keep-alive HTTP/1.1, the connections split between them) and prints one JSON
line: requests/s, p50 and p99 latency for both, and the ratios service / Redis. The load generator is Python: `python -m bench.service_hits`
measures with wrk, a C load generator, instead.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def store_artifact(redis_url: str) -> tuple[str, int]:
    """Compile a small graph and put its artifact in Redis, as a worker would. Returns key, size."""
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest, GraphSpec, Node, NodeRef, Placeholder, TensorSpec
    from fxcc.service.redis_store import RedisStore
    from fxcc.service.settings import ServiceSettings

    x = Placeholder(name="x", spec=TensorSpec(dtype="float32", sizes=[1024, 1024], strides=[1024, 1]))
    nodes = [Node(name="s", target="aten.sin.default", args=[NodeRef(name="x")]),
             Node(name="c", target="aten.cos.default", args=[NodeRef(name="s")])]
    request = CompileRequest(graph=GraphSpec(placeholders=[x], nodes=nodes, outputs=[NodeRef(name="c")]))
    artifact = compile_request(request)
    store = RedisStore(ServiceSettings(redis_url=redis_url))
    store.put_artifact(artifact)
    store.close()
    size = len(artifact.manifest_json()) + sum(len(b) for b in artifact.blobs.values())
    return artifact.manifest.key, size


async def _drive(host: str, port: int, path: str, connections: int, warmup_s: float, seconds: float) -> list[int]:
    """Latencies (ns) of the requests that finished in the measured window, over `connections`."""
    request = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").encode()
    start = time.perf_counter_ns() + int(warmup_s * 1e9)
    stop = start + int(seconds * 1e9)
    latencies: list[int] = []

    async def one_connection() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        while True:
            t0 = time.perf_counter_ns()
            if t0 >= stop:
                break
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"service answered {head[:200]!r}")
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            t1 = time.perf_counter_ns()
            if t0 >= start:
                latencies.append(t1 - t0)
        writer.close()

    await asyncio.gather(*(one_connection() for _ in range(connections)))
    return latencies


def _client_process(args: tuple[str, int, str, int, float, float], out: Any) -> None:
    out.put(asyncio.run(_drive(*args)))


def load_service(port: int, key: str, connections: int, clients: int, seconds: float) -> dict[str, float]:
    per = [connections // clients + (1 if i < connections % clients else 0) for i in range(clients)]
    queue: Any = mp.get_context("fork").Queue()
    procs = [mp.get_context("fork").Process(target=_client_process, args=(
        ("127.0.0.1", port, f"/v1/artifacts/{key}", n, 1.0, seconds), queue)) for n in per if n]
    for p in procs:
        p.start()
    latencies = sorted(lat for _ in procs for lat in queue.get())
    for p in procs:
        p.join()
    return summary(len(latencies) / seconds, latencies)


def summary(rps: float, latencies_ns: list[int]) -> dict[str, float]:
    def pct(q: float) -> float:
        return round(latencies_ns[min(int(q * len(latencies_ns)), len(latencies_ns) - 1)] / 1e6, 3)

    return {"rps": round(rps, 1), "p50_ms": pct(0.50), "p99_ms": pct(0.99), "requests": len(latencies_ns)}


def redis_benchmark(port: int, connections: int, value_bytes: int, requests: int) -> dict[str, float]:
    """redis-benchmark's GET of a `value_bytes` value (its SET test runs first and stores it: GET
    alone would read a missing key, a nil reply of 5 bytes)."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        raise SystemExit("redis-benchmark is not on PATH (Debian: apt-get install redis-tools)")
    out = subprocess.run([exe, "-h", "127.0.0.1", "-p", str(port), "-t", "set,get", "-c", str(connections),
                          "-n", str(requests), "-d", str(value_bytes), "--csv"],
                         check=True, capture_output=True, text=True).stdout
    row = next(r for r in csv.DictReader(io.StringIO(out)) if r["test"] == "GET")
    return {"rps": float(row["rps"]), "p50_ms": float(row["p50_latency_ms"]), "p99_ms": float(row["p99_latency_ms"]),
            "requests": requests}


def start_api(redis_url: str, port: int, processes: int, log: Path, **settings: str) -> subprocess.Popen:
    """`fxcc serve` with `processes` API processes (FXCC_API_PROCESSES) and FXCC_<settings>."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(FXCC_REDIS_URL=redis_url, FXCC_TOKEN=TOKEN, FXCC_PORT=str(port), FXCC_API_PROCESSES=str(processes),
               **{f"FXCC_{k.upper()}": v for k, v in settings.items()})
    cmd = [sys.executable, "-c", f"from fxcc.service.server import serve_main; serve_main('127.0.0.1', {port})"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--processes", type=int, default=1, help="API processes (1 = fxcc serve)")
    parser.add_argument("--clients", type=int, default=4, help="load-generator processes")
    args = parser.parse_args()
    import logging

    logging.disable(logging.INFO)  # uvicorn's access log would cost the server as much as the request
    workdir = Path(tempfile.mkdtemp(prefix="fxcc-load-"))
    redis_port, api_port = free_port(), free_port()
    redis_proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(redis_port),
                                   "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = None
    try:
        import redis

        wait_for(lambda: redis.Redis(port=redis_port).ping(), 10, "redis-server")
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        key, size = store_artifact(redis_url)
        api = start_api(redis_url, api_port, args.processes, workdir / "api.log")
        wait_for(lambda: socket.create_connection(("127.0.0.1", api_port), timeout=1).close() is None, 60, "the API")
        service = load_service(api_port, key, args.connections, args.clients, args.seconds)
        baseline = redis_benchmark(redis_port, args.connections, size, max(int(service["rps"] * 20), 100_000))
        print(json.dumps({
            "bench": "service_load", "cpus": os.cpu_count(), "connections": args.connections,
            "api_processes": args.processes, "load_processes": args.clients, "artifact_bytes": size,
            "service_get_artifact": service, "redis_benchmark_get": baseline,
            "ratio_rps": round(service["rps"] / baseline["rps"], 4),
            "ratio_p50": round(service["p50_ms"] / baseline["p50_ms"], 1),
            "ratio_p99": round(service["p99_ms"] / baseline["p99_ms"], 1),
        }))
    finally:
        if api is not None:
            api.terminate()
            api.wait(timeout=30)
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
