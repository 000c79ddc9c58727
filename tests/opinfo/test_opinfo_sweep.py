"""bench.opinfo's judgement and bench.opinfo_pool's workers: a mismatch is wrong only when fxcc's
error against float64 exceeds eager's and Inductor's by more than the dtype's tolerance; a worker
that dies costs its task only; a spent time budget starts nothing and lists what it did not reach."""

from __future__ import annotations

import json
import math
import os
import signal

import pytest
import torch

from bench import opinfo, opinfo_pool


def test_max_error_counts_in_the_dtypes_tolerance_and_lets_nan_and_inf_agree():
    truth = torch.tensor([1.0, 100.0, float("nan"), float("inf"), 0.0], dtype=torch.float64)
    got = torch.tensor([1.0, 101.0, float("nan"), float("inf"), 0.0], dtype=torch.bfloat16)
    abs_err, in_tol = opinfo.max_error(got, truth)
    assert abs_err == 1.0
    assert in_tol == pytest.approx(1.0 / (1e-5 + 1.6e-2 * 100.0))
    assert opinfo.max_error(torch.tensor([float("nan")]), torch.tensor([1.0], dtype=torch.float64)) \
        == (math.inf, math.inf)
    assert opinfo.max_error(torch.tensor([3]), torch.tensor([3])) == (0.0, 0.0)


def _bf16_sample():
    def fn(x, y):
        return torch.sin(x) * y + x

    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(64, generator=gen).to(torch.bfloat16) for _ in range(2)]
    expected = opinfo._flat(fn)(*tensors)
    aot_eager = opinfo.AotGraph(fn, tensors).aot_eager
    truth = opinfo._flat(fn)(*opinfo.float64_inputs(tensors))[0]
    return fn, tensors, expected, aot_eager, truth


def test_a_result_far_from_float64_is_wrong_and_one_as_close_as_inductor_is_rounding():
    fn, tensors, expected, aot_eager, truth = _bf16_sample()
    off = [expected[0] + 0.25]
    errors, verdict = opinfo.judge_mismatch(fn, tensors, off, expected, aot_eager, 0)
    assert verdict == "wrong"
    assert errors["fxcc"] > 0.2 and errors["eager"] < 0.1 and errors["inductor"] is not None
    rounded = [truth.to(torch.bfloat16)]  # the float64 result rounded once: no worse than anyone's
    errors, verdict = opinfo.judge_mismatch(fn, tensors, rounded, expected, aot_eager, 0)
    assert verdict == "rounding"
    assert errors["fxcc_in_tol"] <= errors["inductor_in_tol"] + 1
    wrong_dtype = [truth.float()]
    assert opinfo.judge_mismatch(fn, tensors, wrong_dtype, expected, aot_eager, 0)[1] == "wrong"


def test_an_op_without_float64_kernels_is_judged_against_the_next_best_reference():
    """On the H200, _softmax_backward_data (bf16 input_dtype left by the upcast) and the attention
    forwards (no float64) made the float64 reference raise, and the sample was counted errored."""
    fn, tensors, expected, aot_eager, truth = _bf16_sample()

    def no_float64(x, y):
        if x.dtype == torch.float64:
            raise RuntimeError("no float64 kernel")
        return fn(x, y)

    errors, verdict = opinfo.judge_mismatch(no_float64, tensors, [truth.to(torch.bfloat16)], expected, aot_eager, 0)
    assert errors["reference"] == "float32" and verdict == "rounding"

    def half_only(x, y):
        if x.dtype != torch.bfloat16:
            raise RuntimeError("bf16 only")
        return fn(x, y)

    errors, verdict = opinfo.judge_mismatch(half_only, tensors, [expected[0] + 0.25], expected, aot_eager, 0)
    assert errors["reference"] == "eager" and errors["eager"] == 0.0 and verdict == "wrong"


def test_a_worker_killed_mid_task_costs_that_task_only(tmp_path, monkeypatch):
    give = opinfo_pool._Worker.give

    def give_then_kill_on_mul(self, task):
        give(self, task)
        if task[0] == "mul":
            os.kill(self.proc.pid, signal.SIGKILL)
    monkeypatch.setattr(opinfo_pool._Worker, "give", give_then_kill_on_mul)
    results = opinfo_pool.Results(tmp_path / "out.json", {"device": "cpu"})
    tasks = [("add", "float32"), ("mul", "float32"), ("abs", "float32")]
    opinfo_pool.run_pool(tasks, "cpu", 1, 1, results, None, 120, 10, lambda line: None)
    by_op = {o["op"]: o for o in results.outcomes}
    assert by_op["add"]["status"] == by_op["abs"]["status"] == "passed"
    assert by_op["mul"]["status"] == "errored" and "worker died" in by_op["mul"]["detail"]
    written = json.loads((tmp_path / "out.json").read_text())["dtypes"]["float32"]
    assert written["passed"] == 2 and written["errored"][0]["op"] == "mul"
    assert written["ops_failing"] == ["mul"] and written["not_reached"] == []


def test_a_spent_budget_starts_nothing_and_lists_the_tasks_not_reached(tmp_path):
    results = opinfo_pool.Results(tmp_path / "out.json", {})
    tasks = [("add", "float32"), ("add", "bfloat16")]
    opinfo_pool.run_pool(tasks, "cpu", 1, 1, results, 0.0, 120, 10, lambda line: None)
    assert results.outcomes == []
    written = json.loads((tmp_path / "out.json").read_text())["dtypes"]
    assert written["float32"]["not_reached"] == ["add"] and written["bfloat16"]["not_reached"] == ["add"]


def test_tasks_are_op_major_and_only_where_the_op_supports_the_dtype():
    tasks = opinfo.wanted_tasks(["softmax", "bitwise_and"], ["float32", "bfloat16"], "cpu")
    assert tasks == [("softmax", "float32"), ("softmax", "bfloat16"),
                     ("softmax.with_dtype", "float32"), ("softmax.with_dtype", "bfloat16")]


def test_a_second_run_redoes_what_the_first_found_failing_or_left(tmp_path):
    first = {"dtypes": {"float32": {"ops_failing": ["cross"], "not_reached": ["zeros"], "unfinished": []},
                        "float16": {"ops_failing": [], "not_reached": [], "unfinished": ["logit"]}}}
    path = tmp_path / "h200-opinfo.json"
    path.write_text(json.dumps(first))
    assert opinfo.ops_to_redo(path) == ["cross", "logit", "zeros"]
    path.write_text(json.dumps({"dtypes": {"float32": {"ops_failing": [], "not_reached": []}}}))
    with pytest.raises(SystemExit):
        opinfo.ops_to_redo(path)


def test_the_frame_walk_finds_the_test_function_as_torchs_stack_walk_does():
    import unittest

    from torch.testing._internal import common_utils

    found = {}

    class Case(unittest.TestCase):
        def test_it(self):
            found["torch"], found["walk"] = common_utils.extract_test_fn(), opinfo._test_fn_from_frames()

    Case("test_it").test_it()
    assert found["torch"] is found["walk"] is Case.test_it
    assert opinfo._test_fn_from_frames() is common_utils.extract_test_fn() is None
    # the samples, seeded by the test function found, are the same with it
    info = opinfo.op_infos()["add"]
    want = [s.input for s in info.sample_inputs("cpu", torch.float32)][:3]
    with opinfo._test_fn_by_frame_walk():
        assert common_utils.extract_test_fn is opinfo._test_fn_from_frames
        got = [s.input for s in info.sample_inputs("cpu", torch.float32)][:3]
    assert common_utils.extract_test_fn is not opinfo._test_fn_from_frames
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
