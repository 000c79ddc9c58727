"""`python -m worker [--concurrency N] [--device auto|cpu|cuda]`."""

from __future__ import annotations

import argparse

from worker.main import worker_main


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m worker", description="fxcc compile worker")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = parser.parse_args()
    worker_main(concurrency=args.concurrency, device=args.device)


if __name__ == "__main__":
    main()
