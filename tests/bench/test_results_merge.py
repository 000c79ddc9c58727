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


def test_several_processes_give_median_runtimes_and_keep_every_sample():
    from bench.run import combine

    samples = [{"name": "ln", "fxcc_ms": f, "inductor_ms": i, "eager_ms": 0.14, "fxcc_gbps": 4000 / f,
                "copy_gbps": 4200.0, "fxcc_vs_inductor": round(f / i, 3)}
               for f, i in ((0.045, 0.047), (0.067, 0.047), (0.054, 0.055))]
    row = combine(samples)
    assert row["fxcc_ms"] == 0.054 and row["inductor_ms"] == 0.047
    assert row["fxcc_ms_samples"] == [0.045, 0.067, 0.054] and row["processes"] == 3
    assert row["fxcc_vs_inductor"] == round(0.054 / 0.047, 3)
    assert row["fxcc_gbps"] == round(4000 / 0.054, 1) and row["gbps"] == row["fxcc_gbps"]
    assert row["fxcc_pct_of_copy"] == round(100 * row["fxcc_gbps"] / 4200, 1)
    assert row["fxcc_vs_inductor_samples"] == [s["fxcc_vs_inductor"] for s in samples]
    assert combine(samples[:1]) == samples[0]


def test_several_processes_keep_each_ones_spread():
    from bench.run import combine

    samples = [{"name": "ln", "fxcc_ms": f, "inductor_ms": 0.047, "fxcc_ms_spread": {"p10": f - 0.001, "p90": f}}
               for f in (0.045, 0.067, 0.054)]
    row = combine(samples)
    assert row["fxcc_ms_spread_samples"] == [s["fxcc_ms_spread"] for s in samples]
    assert "inductor_ms_spread_samples" not in row  # no process measured one


def test_device_time_geomean_covers_only_rows_that_measured_it(tmp_path):
    path = tmp_path / "h200.json"
    rows = [_row("cos_sin", 1.0), {**_row("softmax", 0.8), "fxcc_vs_inductor_device": 0.5},
            {**_row("resnet50", 0.5), "fxcc_vs_inductor_device": 2.0}]
    doc = merge(path, rows, {})
    assert doc["fxcc_vs_inductor_device_geomean"] == 1.0 and doc["fxcc_vs_inductor_device_workloads"] == 2
