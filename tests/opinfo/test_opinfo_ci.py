"""The CI-sized OpInfo sweep: zero failures allowed (an op that can't be done right must go extern).

The full sweep is `TRITON_INTERPRET=1 .venv/bin/python tests/opinfo/sweep.py --all --out
tests/opinfo/SUMMARY.md`."""

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sweep import CI_OPS, render, summarize, sweep


def test_ci_subset_has_no_failures(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = sweep(CI_OPS, [torch.float32, torch.bfloat16], max_samples=3)
    per = summarize(results)
    covered = {op for op, _ in per}
    assert len(covered) >= 0.9 * len(CI_OPS), sorted(set(CI_OPS) - covered)
    with capsys.disabled():
        print("\n" + render(results, 0).split("\n\n")[1])
    failed = [r for r in results if r.status == "failed"]
    assert not failed, "\n".join(f"{r.op} {r.dtype}: {r.detail}" for r in failed)
