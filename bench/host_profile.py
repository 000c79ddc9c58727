"""Where fxcc's host time per call goes: cProfile over a few calls of a compiled workload.

A diagnostic, not a benchmark: `python -m bench.host_profile --workload resnet50`.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile

import torch

from bench.workloads import WORKLOADS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="resnet50")
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    os.environ.setdefault("FXCC_CACHE_DIR", tempfile.mkdtemp(prefix="fxcc-host-"))
    from fxcc.client.backend import fxcc_backend

    wl = WORKLOADS[args.workload]("cuda" if torch.cuda.is_available() else "cpu")
    fn = torch.compile(wl.fn, backend=fxcc_backend)
    with torch.no_grad():
        for _ in range(3):
            fn(*wl.inputs)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn(*wl.inputs)
        prof.disable()
        torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
