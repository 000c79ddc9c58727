"""FXCC_LOGS (compiler_core.stage_logs): every stage of a compile printed per graph — the aten graph,
the loop IR op by op, the schedule with why each kernel ended, the kernels' source, the plan, the
guards — and nothing formatted when a stage is off."""

from __future__ import annotations

import logging

import pytest
import torch

from fxcc.compiler_core import stage_logs
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import (
    CompileRequest,
    GraphSpec,
    Node,
    NodeRef,
    Placeholder,
    SymbolSpec,
    TensorSpec,
)
from tests.compiler_core.helpers import compile_fn


def softmax_mm(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.relu(torch.softmax(x, -1) @ w) + 1, x[:, :3].sum()


def logged(caplog: pytest.LogCaptureFixture, stage: str) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == f"fxcc.logs.{stage}")


def test_each_stage_prints_what_it_made(caplog: pytest.LogCaptureFixture) -> None:
    for stage in stage_logs.STAGES:
        caplog.set_level(logging.INFO, logger=f"fxcc.logs.{stage}")
    compile_fn(softmax_mm, torch.randn(4, 16), torch.randn(16, 8))
    graph = logged(caplog, "graph")
    assert "aten.mm.default(_softmax, w_1)  # float32[4, 8]" in graph and "x_1: input  # float32[4, 16]" in graph
    ir = logged(caplog, "ir")
    assert "Reduction max float32 ranges=[4, 1] reduction_ranges=[16]" in ir
    assert "exp(tmp3)" in ir and "mm = extern aten.mm.default(" in ir and "store tmp" in ir
    schedule = logged(caplog, "schedule")
    assert "[0] kernel (persistent, x=4, r=16): buf0, buf1, buf2" in schedule  # softmax: one kernel
    assert "ended: extern aten.mm.default (mm) reads a value of the kernel" in schedule
    assert "did not fuse: its iteration space (32, 1) does not map onto the kernel's (x=1, r=12)" in schedule
    assert logged(caplog, "kernels").count("@triton.jit\ndef fxcc_") == 3
    plan = logged(caplog, "plan")
    assert "extern  {'op': 'aten.mm.default'" in plan and plan.count("\nkernel  ") == 3
    assert "static sizes" in logged(caplog, "guards")


def test_a_symbolic_graph_prints_its_bindings_and_guards(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fxcc.logs.guards")
    spec = TensorSpec(dtype="float32", sizes=["s0", 8], strides=[8, 1])
    graph = GraphSpec(symbols=[SymbolSpec(name="s0")], placeholders=[Placeholder(name="x", spec=spec)],
                      nodes=[Node(name="y", target="aten.sin.default", args=[NodeRef(name="x")])],
                      outputs=[NodeRef(name="y")])
    compile_request(CompileRequest(graph=graph, hints={"s0": 5}))
    guards = logged(caplog, "guards")
    assert "s0: input 0 dim 0, [2, None]" in guards and "s0 >= 2" in guards


def test_stages_that_are_off_are_never_formatted(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    def boom(*args: object) -> str:
        raise AssertionError("formatted although off")

    monkeypatch.setattr(stage_logs, "format_ir", boom)
    caplog.set_level(logging.WARNING, logger="fxcc.logs.ir")
    compile_fn(lambda x: x.cos(), torch.randn(3))


def test_a_process_logging_at_info_formats_no_stage_unless_named(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    def boom(*args: object) -> str:
        raise AssertionError("formatted although FXCC_LOGS does not name it")

    for name in ("format_graph", "format_ir", "format_schedule", "format_kernels", "format_plan", "format_guards"):
        monkeypatch.setattr(stage_logs, name, boom)
    monkeypatch.setattr(stage_logs, "RECORDED", ())  # the artifact's stage log would format some
    caplog.set_level(logging.INFO)  # the root logger, as `fxcc serve` sets it
    try:
        assert stage_logs.configure("") == set()
        art = compile_fn(lambda x: x.cos(), torch.randn(3))
        assert art.manifest.stats.kernels == 1  # a formatter's AssertionError would have made it extern
        assert not [r for r in caplog.records if r.name.startswith("fxcc.logs.")]
    finally:
        for stage in stage_logs.STAGES:
            stage_logs.logger(stage).setLevel(logging.NOTSET)


def test_fxcc_logs_names_stages_or_all() -> None:
    try:
        assert stage_logs.configure("ir, plan") == {"ir", "plan"}
        assert stage_logs.logger("plan").isEnabledFor(logging.INFO)
        assert stage_logs.configure("all") == set(stage_logs.STAGES)
        with pytest.raises(ValueError, match="unknown stages \\['kernel'\\]; known: graph, ir"):
            stage_logs.configure("kernel")
    finally:
        for stage in stage_logs.STAGES:
            log = stage_logs.logger(stage)
            log.handlers.clear()
            log.setLevel(logging.NOTSET)
            log.propagate = True


def test_the_artifact_keeps_a_bounded_stage_log(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from bench.compile_scaling import fan_graph

    monkeypatch.setattr(stage_logs, "RECORD_MAX_CHARS", 2000)
    art = compile_request(CompileRequest(graph=fan_graph(120)))
    log = json.loads(art.blobs[art.manifest.stage_log.digest])
    texts = {e["stage"]: e["text"] for e in log["stages"]}
    assert set(texts) == {"graph", "schedule", "plan", "guards"} and log["schema"] == 1
    for stage in ("graph", "plan"):  # 120 nodes and steps: cut, saying so
        assert len(texts[stage]) <= 2000 and texts[stage].endswith("more lines not kept)"), texts[stage][-200:]
    assert texts["graph"].startswith("x: input  # float32[8, 16]")
