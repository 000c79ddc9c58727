"""Cache hits measured with wrk beside redis-benchmark (issue 24), and a simulated cluster start.

`python -m bench.service_hits [--out DIR] [--seconds 6] [--repeats 3] [--processes 1,2]
[--connections 64,512] [--batch-keys 64] [--ranks 64] [--graphs 100] [--modes single,bundle,batch]`

Starts its own redis-server on a free port and stores signed artifacts (one compiled graph under
`--graphs` keys, as a model's graphs, each with a kernel source of its own: no two share a blob),
then for each API process count (`fxcc serve`, FXCC_API_PROCESSES) and connection count: wrk on
`GET /v1/artifacts/{key}` (single), on `GET /v1/bundles/{key}` of `--batch-keys` artifacts
(bundle; assembled once by a POST first) and on `POST /v1/artifacts/batch` with those keys (batch,
the NDJSON stream), each run followed at once by `redis-benchmark` GET of a value of the artifact's
size on the same Redis, `--repeats` times. Each row has requests/s, p50/p99 and the ratio
service_rps / redis_rps of that pair of runs. Where nginx is installed, single hits and bundles
are measured again through deploy/nginx-cache.conf (`via`).

The cluster start: `--ranks` client processes (forked, imports done) wait at a barrier, then each
fetches a model's `--graphs` artifacts through `RemoteService` (signature and digests checked, as a
warm start does): one GET per graph, one batch request, or its bundle (none stored before: the
first asks assemble it), `--cluster-repeats` times. Reported: the time from the first rank's start
until the last rank has them all. `--cluster-only` skips the wrk rows. Everything goes to DIR/service_hits.json (default
bench/results/cpu-service-hits.json) and one JSON line per measurement to stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.service_load import REPO, TOKEN, free_port, redis_benchmark, start_api, wait_for

WRK_REPORT = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"errors":%d,"non2xx":%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def store_model(redis_url: str, graphs: int) -> tuple[list[str], int, str]:
    """`graphs` signed artifacts (one compiled graph under as many keys); returns keys, bytes of one
    artifact, and the public key that signed them."""
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.signing import Signer, generate
    from fxcc.compiler_core.wire import CompileRequest, GraphSpec, Node, NodeRef, Placeholder, TensorSpec
    from fxcc.service.redis_store import RedisStore
    from fxcc.service.settings import ServiceSettings

    x = Placeholder(name="x", spec=TensorSpec(dtype="float32", sizes=[1024, 1024], strides=[1024, 1]))
    nodes = [Node(name="s", target="aten.sin.default", args=[NodeRef(name="x")]),
             Node(name="c", target="aten.cos.default", args=[NodeRef(name="s")])]
    base = compile_request(CompileRequest(graph=GraphSpec(placeholders=[x], nodes=nodes, outputs=[NodeRef(name="c")])))
    signer = Signer(generate()[0])
    store = RedisStore(ServiceSettings(redis_url=redis_url))
    keys = []
    for n in range(graphs):
        art = _own_source(base, f"{n + 1:064x}", n)
        store.put_artifact(art, signer.sign(art.manifest))
        keys.append(art.manifest.key)
    store.close()
    size = len(base.manifest_json()) + sum(len(b) for b in base.blobs.values())
    return keys, size, signer.public.text


def _own_source(base: Any, key: str, n: int) -> Any:
    """`base` under `key`, its kernels' sources made its own (a comment): a bundle then holds as
    many bytes as its artifacts, as a real model's graphs, which share no kernel."""
    from fxcc.compiler_core.artifact import Artifact, BlobRef, digest

    blobs = {}
    kernels = []
    for k in base.manifest.kernels:
        text = base.blobs[k.source.digest] + f"\n# graph {n:05d}\n".encode()
        blobs[digest(text)] = text
        blobs.update({b.digest: base.blobs[b.digest] for b in k.binaries.values()})
        kernels.append(k.model_copy(update={"source": BlobRef(digest=digest(text), size=len(text))}))
    return Artifact(base.manifest.model_copy(update={"key": key, "kernels": kernels}), blobs)


def wrk(url: str, connections: int, seconds: int, workdir: Path, body: str | None = None) -> dict[str, Any]:
    script = workdir / "wrk.lua"
    lines = [f'wrk.headers["Authorization"] = "Bearer {TOKEN}"']
    if body is not None:
        lines += ['wrk.method = "POST"', 'wrk.headers["Content-Type"] = "application/json"',
                  f"wrk.body = {json.dumps(body)}"]
    script.write_text("\n".join(lines) + WRK_REPORT)
    exe = shutil.which("wrk")
    if exe is None:
        raise SystemExit("wrk is not on PATH (Debian: apt-get install wrk)")
    out = subprocess.run([exe, "-t", "2", "-c", str(connections), "-d", f"{seconds}s", "--timeout", "10s",
                          "-s", str(script), url], check=True, capture_output=True, text=True).stdout
    report = json.loads(next(line for line in out.splitlines() if line.startswith("WRK "))[4:])
    ok = report["requests"] - report["non2xx"]  # answers other than 2xx or 3xx count for nothing
    return {"rps": round(ok / (report["duration_us"] / 1e6), 1),
            "p50_ms": round(report["p50_us"] / 1e3, 3), "p99_ms": round(report["p99_us"] / 1e3, 3),
            "requests": report["requests"], "errors": report["errors"], "non2xx": report["non2xx"]}


def start_nginx(api_port: int, workdir: Path) -> tuple[subprocess.Popen, int] | None:
    """nginx with deploy/nginx-cache.conf in front of the API on a free port; None without nginx."""
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if exe is None:
        return None
    port = free_port()
    root = workdir / "nginx"
    (root / "cache").mkdir(parents=True)
    # nginx's workers run as another user (nobody, under root): they must reach and write the cache
    workdir.chmod(0o755)
    root.chmod(0o755)
    (root / "cache").chmod(0o777)
    conf = (REPO / "deploy/nginx-cache.conf").read_text()
    conf = (conf.replace("/var/cache/nginx/", f"{root}/cache/").replace("127.0.0.1:8470", f"127.0.0.1:{api_port}")
            .replace("listen 8480", f"listen 127.0.0.1:{port}"))
    (root / "fxcc.conf").write_text(conf)
    (root / "nginx.conf").write_text(
        f"worker_processes 1;\ndaemon off;\npid {root}/nginx.pid;\nerror_log {root}/error.log warn;\n"
        f"events {{ worker_connections 8192; }}\nhttp {{ access_log off; include {root}/fxcc.conf; }}\n")
    proc = subprocess.Popen([exe, "-p", str(root), "-c", str(root / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: _healthy(port), 10, "nginx")
    return proc, port


def load_rows(api_port: int, redis_port: int, keys: list[str], size: int, args: argparse.Namespace,
              processes: int, workdir: Path, modes: tuple[str, ...], via: str = "api") -> list[dict[str, Any]]:
    from fxcc.compiler_core.bundle import bundle_key

    rows = []
    batch = json.dumps({"keys": keys[:args.batch_keys]})
    for connections in args.connections:
        for mode in modes:
            for repeat in range(args.repeats):
                if mode == "single":
                    service = wrk(f"http://127.0.0.1:{api_port}/v1/artifacts/{keys[0]}", connections,
                                  args.seconds, workdir)
                elif mode == "bundle":
                    service = wrk(f"http://127.0.0.1:{api_port}/v1/bundles/{bundle_key(keys[:args.batch_keys])}",
                                  connections, args.seconds, workdir)
                else:
                    service = wrk(f"http://127.0.0.1:{api_port}/v1/artifacts/batch", connections,
                                  args.seconds, workdir, body=batch)
                if mode != "single":
                    service["artifacts_per_request"] = args.batch_keys
                    service["artifacts_per_s"] = round(service["rps"] * args.batch_keys, 1)
                baseline = redis_benchmark(redis_port, connections, size, max(int(args.seconds * 60_000), 200_000))
                row = {"via": via, "api_processes": processes, "connections": connections, "mode": mode, "repeat": repeat,
                       "service": service, "redis_benchmark_get": baseline,
                       "service_rps / redis_rps": round(service["rps"] / baseline["rps"], 4)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def _rank(url: str, keys: list[str], mode: str, public: str, barrier: Any, out: Any) -> None:
    """One rank of the simulated cluster start: fetch every key once the barrier opens."""
    from fxcc.client.remote import RemoteService
    from fxcc.compiler_core.signing import PublicKey, TrustedKeys

    service = RemoteService(url, TOKEN, timeout_s=120, trusted=TrustedKeys([PublicKey(public)]))
    barrier.wait()
    start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
    try:
        if mode == "batch":
            got = len(service.get_artifacts(keys))
        elif mode == "bundle":
            got = len(service.get_bundled(keys))
        else:
            got = sum(service.get_artifact(k) is not None for k in keys)
        out.put((got, start, time.monotonic()))
    except Exception as e:  # noqa: BLE001 - reported, not raised: the parent counts failures
        out.put((-1, start, f"{type(e).__name__}: {e}"))
    finally:
        service.close()


def cluster_start(api_port: int, keys: list[str], public: str, ranks: int, mode: str) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(ranks + 1), ctx.Queue()
    url = f"http://127.0.0.1:{api_port}"
    procs = [ctx.Process(target=_rank, args=(url, keys, mode, public, barrier, out)) for _ in range(ranks)]
    for p in procs:
        p.start()
    barrier.wait()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    # from the first rank's start (a loaded machine may run the ranks before this process resumes)
    t0 = min(r[1] for r in results)
    failed = [r[2] for r in results if r[0] != len(keys)]
    ends = [r[2] - t0 for r in results if r[0] == len(keys)]
    return {"mode": mode, "ranks": ranks, "graphs": len(keys), "ok_ranks": len(ends), "failures": failed[:3],
            "last_rank_s": round(max(ends), 3) if ends else None,
            "median_rank_s": round(statistics.median(ends), 3) if ends else None,
            "artifacts_per_s": round(len(ends) * len(keys) / max(ends), 1) if ends else None,
            "requests": ranks * (len(keys) if mode == "single" else 1)}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (processes, connections, mode): medians of the repeats."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["via"], r["api_processes"], r["connections"], r["mode"]), []).append(r)
    out = []
    for (via, processes, connections, mode), rs in groups.items():

        def med(f: Any, rs: list[dict[str, Any]] = rs) -> float:
            return round(statistics.median(f(r) for r in rs), 4)

        entry = {"via": via, "api_processes": processes, "connections": connections, "mode": mode,
                 "service_rps": med(lambda r: r["service"]["rps"]), "service_p50_ms": med(lambda r: r["service"]["p50_ms"]),
                 "service_p99_ms": med(lambda r: r["service"]["p99_ms"]), "redis_rps": med(lambda r: r["redis_benchmark_get"]["rps"]),
                 "service_rps / redis_rps": med(lambda r: r["service_rps / redis_rps"]),
                 "ratios": [r["service_rps / redis_rps"] for r in rs]}
        if mode != "single":
            entry["artifacts_per_s"] = med(lambda r: r["service"]["artifacts_per_s"])
        out.append(entry)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="directory for service_hits.json")
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", default=f"1,{max(2, (os.cpu_count() or 2) // 2)}")
    parser.add_argument("--connections", default="64,512")
    parser.add_argument("--batch-keys", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--graphs", type=int, default=100)
    parser.add_argument("--modes", default="single,bundle,batch", help="of single, bundle, batch")
    parser.add_argument("--no-nginx", action="store_true", help="skip the rows through deploy/nginx-cache.conf")
    parser.add_argument("--cluster-only", action="store_true", help="only the simulated cluster starts")
    parser.add_argument("--cluster-repeats", type=int, default=1)
    args = parser.parse_args()
    modes = tuple(args.modes.split(","))
    args.connections = [int(c) for c in args.connections.split(",")]
    processes_list = [int(p) for p in args.processes.split(",")]
    out_path = (args.out / "service_hits.json") if args.out else REPO / "bench/results/cpu-service-hits.json"
    workdir = Path(tempfile.mkdtemp(prefix="fxcc-hits-"))
    redis_port = free_port()
    redis_proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(redis_port),
                                   "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results: dict[str, Any] = {"bench": "service_hits", "command": " ".join(["python -m bench.service_hits", *sys.argv[1:]]),
                               "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    rows: list[dict[str, Any]] = []
    cluster: list[dict[str, Any]] = []
    try:
        import redis

        wait_for(lambda: redis.Redis(port=redis_port).ping(), 10, "redis-server")
        keys, size, public = store_model(f"redis://127.0.0.1:{redis_port}/0", max(args.graphs, args.batch_keys))
        results["artifact_bytes"] = size
        for processes in processes_list:
            api_port = free_port()
            api = start_api(f"redis://127.0.0.1:{redis_port}/0", api_port, processes, workdir / f"api-{processes}.log")
            try:
                _wait_started(workdir / f"api-{processes}.log", processes, api_port)
                _assemble(api_port, keys[:args.batch_keys])
                if not args.cluster_only:
                    rows += load_rows(api_port, redis_port, keys, size, args, processes, workdir, modes)
                for repeat in range(args.cluster_repeats):
                    for mode in modes:
                        _forget_bundles(redis_port)  # each cluster start finds none stored
                        c = cluster_start(api_port, keys[:args.graphs], public, args.ranks, mode)
                        c.update(api_processes=processes, repeat=repeat)
                        print(json.dumps({"cluster_start": c}), flush=True)
                        cluster.append(c)
                if processes == processes_list[-1] and not (args.no_nginx or args.cluster_only):
                    nginx = start_nginx(api_port, workdir)
                    _assemble(api_port, keys[:args.batch_keys])  # the cluster starts dropped it
                    if nginx is not None:
                        try:
                            rows += load_rows(nginx[1], redis_port, keys, size, args, processes, workdir,
                                              tuple(m for m in modes if m != "batch"), via="nginx-cache.conf")
                        finally:
                            nginx[0].terminate()
                            nginx[0].wait(timeout=10)
            finally:
                api.terminate()
                api.wait(timeout=60)
        results.update(summary=summarise(rows), cluster_start=cluster, runs=rows)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {out_path}", file=sys.stderr)
    finally:
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def _forget_bundles(redis_port: int) -> None:
    """No bundle stored, and none left in an API process's cache (FXCC_BUNDLE_CACHE_S, 1 s)."""
    import redis

    r = redis.Redis(port=redis_port)
    names = list(r.scan_iter(match="fxcc:bundle:*", count=1000))
    if names:
        r.delete(*names)
    time.sleep(1.2)


def _assemble(port: int, keys: list[str]) -> None:
    """The bundle of `keys` assembled and stored (POST /v1/bundles), as a first rank's warm start does."""
    import httpx

    r = httpx.post(f"http://127.0.0.1:{port}/v1/bundles", json={"keys": keys},
                   headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    r.raise_for_status()


def _wait_started(log: Path, processes: int, port: int) -> None:
    """Until every API process has started (uvicorn logs each) and /healthz answers."""
    wait_for(lambda: log.read_text().count("Application startup complete") >= processes, 120, "the API")
    wait_for(lambda: _healthy(port), 30, "the API")


def _healthy(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        return s.recv(64).startswith(b"HTTP/1.1 200")


if __name__ == "__main__":
    main()
