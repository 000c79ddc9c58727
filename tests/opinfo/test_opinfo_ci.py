"""The CI-sized OpInfo sweep: no wrong result and no error (an op that can't be done right must go extern).

A mismatch with eager is allowed only when fxcc's error against float64 is within the dtype's
tolerance of eager's or Inductor's (bench.opinfo.judge_mismatch). The full sweep is
`TRITON_INTERPRET=1 .venv/bin/python tests/opinfo/sweep.py --all --out tests/opinfo/SUMMARY.md`;
on a GPU, `python -m bench.opinfo --device cuda --out DIR`."""

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sweep import GPU_FAILING, KNOWN_ROUNDING, ci_ops, failed, op_infos, render, summarize, sweep


def test_ci_subset_has_no_failures(capsys):
    ops = ci_ops()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcomes = sweep(ops, [torch.float32, torch.bfloat16], max_samples=3)
        outcomes += sweep(KNOWN_ROUNDING + GPU_FAILING, [torch.float16], max_samples=3)
    per = summarize(outcomes)
    infos = op_infos()
    covered = {op for op, _ in per} | {infos[op].name for op, _ in per}
    assert len(covered & set(ops)) >= 0.9 * len(ops), sorted(set(ops) - covered)
    with capsys.disabled():
        print("\n" + render(outcomes, 0).split("\n\n")[1])
    bad = [o for o in outcomes if failed(o)]
    assert not bad, "\n".join(f"{o.op} {o.dtype} sample {o.sample}: {o.detail} {o.errors or ''}" for o in bad)
    # the known bf16/fp16 mismatches were judged, with every yardstick's error against float64
    judged = [o for o in outcomes if o.status == "mismatched"]
    assert {o.op for o in judged} >= {"cross", "logit"}
    assert all(o.errors and o.errors["eager"] is not None and "inductor" in o.errors for o in judged)
