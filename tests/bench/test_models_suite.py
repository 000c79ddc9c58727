"""bench.models end to end on the CPU: tiny transformers configs (GPT-2 inference, a GPT-2 training
step), one child process per model, the Triton interpreter for fxcc's kernels. The rows carry the
issue's fields, fxcc compiled every graph (no fallback) and its results match eager's: the output
within the suite's tolerance, the training losses step by step. A second run merges into the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from bench.model_zoo import GROUPS, ZOO
from bench.models import LOSS_STEPS, OUTPUT_TOL, resolve, summary

REPO = Path(__file__).parents[2]
ISSUE_FIELDS = ("name", "source", "kind", "dtype", "eager_ms", "inductor_ms", "fxcc_ms", "fxcc_peak_mb",
                "inductor_peak_mb")


def _suite(out: Path, models: str, modes: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(TRITON_INTERPRET="1", FXCC_DYNAMO_CACHE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    p = subprocess.run([sys.executable, "-m", "bench.models", "--device", "cpu", "--tiny", "--models", models,
                        "--modes", modes, "--out", str(out)], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((out / "h200-models.json").read_text())


def test_the_suite_measures_real_models_and_fxcc_matches_eager(tmp_path):
    doc = _suite(tmp_path, "gpt2", "eager,inductor_default,fxcc")
    (row,) = doc["rows"]
    assert set(ISSUE_FIELDS) <= set(row), row
    assert (row["name"], row["source"], row["kind"], row["dtype"]) == ("gpt2", "transformers", "inference", "float32")
    assert "error" not in row and "skipped" not in row
    assert row["fxcc_graphs"] >= 1 and row["fxcc_fallbacks"] == 0
    assert row["fxcc_rel_err"] <= OUTPUT_TOL["float32"] and row["matches_eager"] is True
    assert row["inductor_mode"] == "default" and row["inductor_ms"] == row["inductor_default_ms"] > 0
    assert row["fxcc_ms"] > 0 and row["eager_ms"] > 0
    assert (tmp_path / "logs" / "gpt2.log").is_file()

    doc = _suite(tmp_path, "gpt2_train", "eager,fxcc")  # merged beside the first run's row
    assert [r["name"] for r in doc["rows"]] == ["gpt2", "gpt2_train"]
    train = doc["rows"][1]
    assert set(ISSUE_FIELDS) <= set(train) and train["kind"] == "training"
    assert len(train["eager_losses"]) == len(train["fxcc_losses"]) == LOSS_STEPS
    assert train["fxcc_fallbacks"] == 0 and train["matches_eager"] is True
    assert train["fxcc_loss_rel_diff"] <= train["tolerance"]
    # AdamW moved the weights: the losses are of five different steps, not one repeated
    assert len(set(train["eager_losses"])) > 1
    assert doc["summary"]["training"]["not_matching_eager"] == []


def test_the_suite_covers_the_issue():
    kinds = [ZOO[n] for n in GROUPS["all"]]
    inference = [s for s in kinds if s.kind == "inference"]
    training = [s for s in kinds if s.kind == "training"]
    assert len(inference) >= 12 and {s.source for s in inference} == {"transformers", "timm", "torchvision"}
    assert {s.dtype for s in inference} == {"float32", "bfloat16"}
    assert sum(s.source == "transformers" for s in training) >= 2 and sum(s.source != "transformers"
                                                                          for s in training) >= 2
    assert resolve("training,gpt2,gpt2_train") == [*GROUPS["training"], "gpt2"]


def test_the_summary_compares_with_inductor_and_flags_rows():
    rows = [{"name": "a", "kind": "inference", "fxcc_vs_inductor": 0.5, "fxcc_vs_inductor_peak": 1.0,
             "fxcc_vs_inductor_reserved": 1.1},
            {"name": "b", "kind": "inference", "fxcc_vs_inductor": 2.0, "fxcc_vs_inductor_peak": 1.05,
             "fxcc_vs_inductor_reserved": 0.9, "matches_eager": False},
            {"name": "c", "kind": "training", "error": "exit 1"}]
    s = summary(rows)
    assert s["inference"]["fxcc_vs_inductor_geomean"] == 1.0
    assert s["inference"]["slower_than_inductor"] == ["b"] and s["inference"]["peak_above_inductor_2pct"] == ["b"]
    assert s["inference"]["not_matching_eager"] == ["b"] and s["training"]["failed"] == ["c"]
    assert s["inference"]["reserved_above_inductor_2pct"] == ["a"]
    assert s["inference"]["reserved_ratio_geomean"] == pytest.approx((1.1 * 0.9) ** 0.5, abs=1e-3)


def test_the_h200_results_hold_a_row_of_every_model_with_the_issues_fields():
    """bench/results/h200-models.json (measured on the H200) holds the issue's columns for every
    model of the zoo, its summary is the summary of its rows, and the ratios are of its own numbers."""
    doc = json.loads((Path(__file__).resolve().parents[2] / "bench/results/h200-models.json").read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    assert set(rows) == set(ZOO)
    for name, r in rows.items():
        assert (r["source"], r["kind"], r["dtype"]) == (ZOO[name].source, ZOO[name].kind, ZOO[name].dtype)
        for key in ("eager_ms", "inductor_ms", "fxcc_ms", "fxcc_peak_mb", "inductor_peak_mb"):
            assert r[key] > 0, (name, key)
        assert r["fxcc_vs_inductor"] == pytest.approx(r["fxcc_ms"] / r["inductor_ms"], abs=2e-3)
        if r["kind"] == "inference":
            assert r["inductor_ms"] == min(r["inductor_default_ms"], r["inductor_reduce_overhead_ms"])
    assert doc["summary"] == summary(doc["rows"])
