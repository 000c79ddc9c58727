"""bench.run's merge into bench/results/<device>.json: a run without first calls keeps the first-call
results an earlier run measured, stamped with when; a run with them replaces them."""

from __future__ import annotations

import json

from bench.run import merge


def _row(name, ms, **first_calls):
    row = {"name": name, "fxcc_ms": ms, "inductor_ms": 1.0, "fxcc_vs_inductor": ms,
           "measured_at": f"T{ms}"}
    return {**row, **first_calls}


def test_a_run_without_first_calls_keeps_the_earlier_ones_with_their_date(tmp_path):
    path = tmp_path / "h200.json"
    first = merge(path, [_row("resnet50", 2.0, inductor_cold_s=26.8, fxcc_warm_s=14.2,
                                fxcc_warm_detail={"fxcc_own_s": 0.3})], {})
    path.write_text(json.dumps(first))
    again = merge(path, [_row("resnet50", 1.5, inductor_cold_s=None, fxcc_warm_s=None)], {})
    (row,) = again["workloads"]
    assert row["fxcc_ms"] == 1.5 and row["measured_at"] == "T1.5"
    assert row["inductor_cold_s"] == 26.8 and row["fxcc_warm_s"] == 14.2
    assert row["fxcc_warm_detail"] == {"fxcc_own_s": 0.3}
    assert row["first_call_measured_at"] == "T2.0"
    assert again["fxcc_vs_inductor_geomean"] == 1.5


def test_a_run_with_first_calls_replaces_them(tmp_path):
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(merge(path, [_row("cos_sin", 1.0, inductor_cold_s=9.0)], {})))
    (row,) = merge(path, [_row("cos_sin", 1.1, inductor_cold_s=8.0)], {})["workloads"]
    assert row["inductor_cold_s"] == 8.0 and "first_call_measured_at" not in row
