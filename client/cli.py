"""The `fxcc` command: serve, worker, demo, precompile, status, jobs, stats, cache, keygen, doctor."""

from __future__ import annotations

import argparse
import logging
import sys

from fxcc import extras


def _serve(args: argparse.Namespace) -> int:
    if (status := extras.require("serve", "service")) is not None:
        return status
    from fxcc.service.server import serve_main

    serve_main(args.host, args.port)
    return 0


def _worker(args: argparse.Namespace) -> int:
    if (status := extras.require("worker", "worker")) is not None:
        return status
    from fxcc.worker.main import worker_main

    worker_main(concurrency=args.concurrency, device=args.device)
    return 0


def _demo(args: argparse.Namespace) -> int:
    if (status := extras.require("demo", "service")) is not None:  # the demo starts `fxcc serve`
        return status
    from fxcc.client.demo import main as demo_main

    return demo_main(args)


def _precompile(args: argparse.Namespace) -> int:
    """Run a user's script with the backend in precompile mode: submit compiles, never wait."""
    import os
    import runpy

    from fxcc.client import backend

    os.environ["FXCC_PRECOMPILE"] = "1"
    if args.world_size is not None:
        from fxcc.client.process_groups import stand_in_for_job

        stand_in_for_job(args.world_size, args.rank)
    sys.argv = [args.script, *args.args]
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            print(f"fxcc precompile: {args.script} exited with {e.code}", file=sys.stderr)
            return int(e.code) if isinstance(e.code, int) else 1
    evs = [e for e in backend.events() if e.source.startswith("precompile") or e.source == "local-hit"]
    for e in evs:
        print(f"{e.key[:16]}  {e.source:22} {e.job_id or '-'}")
    failed = [e for e in backend.events() if e.source == "fallback"]
    print(f"fxcc precompile: {len(evs)} graph(s) submitted or already cached, {len(failed)} not capturable")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    """A new Ed25519 key pair for workers: the private key for FXCC_SIGNING_KEY(_FILE) on workers,
    the public key for FXCC_TRUSTED_KEYS on clients."""
    from pathlib import Path

    from fxcc.compiler_core.signing import write_key_pair

    private = Path(args.out)
    public = private.with_name(private.name + ".pub")
    try:
        signer = write_key_pair(private, public)
    except (FileExistsError, OSError) as e:
        print(f"fxcc keygen: {e}", file=sys.stderr)
        return 1
    print(f"private key (workers: FXCC_SIGNING_KEY_FILE={private}; keep it secret): {private}")
    print(f"public key  (clients: FXCC_TRUSTED_KEYS={public}): {public}")
    print(signer.public.text)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from fxcc.client.doctor import doctor

    return doctor(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fxcc", description="fxcc: compiler-as-a-service for PyTorch 2")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the HTTP service (embedded store + worker without FXCC_REDIS_URL)")
    s.add_argument("--host", default=None, help="bind address (default FXCC_HOST or 127.0.0.1)")
    s.add_argument("--port", type=int, default=None, help="port (default FXCC_PORT or 8470)")
    s.set_defaults(fn=_serve)

    w = sub.add_parser("worker", help="run a compile worker on the Redis queue (needs FXCC_REDIS_URL)")
    w.add_argument("--concurrency", type=int, default=1, help="jobs compiled at once")
    w.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or a GPU index N (one worker per GPU)")
    w.set_defaults(fn=_worker)

    d = sub.add_parser("demo", help="compile the seed examples through a local service and print a table")
    d.add_argument("--workdir", default=None, help="where the demo keeps its service data and caches")
    d.set_defaults(fn=_demo)

    pc = sub.add_parser("precompile", help="run a script with fxcc submitting compiles without waiting, "
                        "so a cluster's cache is warm before a job starts")
    pc.add_argument("--world-size", type=int, default=None,
                    help="a distributed script: run it as one rank of a job of this many ranks, its "
                    "collectives faked, so that it submits the graphs every rank of that job will ask for")
    pc.add_argument("--rank", type=int, default=0, help="with --world-size: the rank to run as (default 0)")
    pc.add_argument("script")
    pc.add_argument("args", nargs=argparse.REMAINDER)
    pc.set_defaults(fn=_precompile)

    from fxcc.client.cli_service import add_parsers

    add_parsers(sub)

    kg = sub.add_parser("keygen", help="make an Ed25519 key pair: workers sign artifacts with the private key, "
                        "clients trust the public one")
    kg.add_argument("--out", default="fxcc-signing.key",
                    help="the private key's file (mode 0600; the public key goes to the same name + .pub)")
    kg.set_defaults(fn=_keygen)

    doc = sub.add_parser("doctor", help="versions, GPU, service and cache settings")
    doc.add_argument("--json", action="store_true")
    doc.set_defaults(fn=_doctor)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose or args.command in ("serve", "worker")
                        else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
