"""`python -m fxcc.worker [--concurrency N] [--device auto|cpu|cuda]`."""

from __future__ import annotations

import argparse
import sys

from fxcc import extras


def main() -> None:
    if (status := extras.require("worker", "worker")) is not None:
        sys.exit(status)
    from fxcc.worker.main import worker_main

    parser = argparse.ArgumentParser(prog="python -m fxcc.worker", description="fxcc compile worker")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = parser.parse_args()
    worker_main(concurrency=args.concurrency, device=args.device)


if __name__ == "__main__":
    main()
