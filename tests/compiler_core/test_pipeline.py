"""compiler_core/pipeline.py: the stages in order, heard by the callback and timed; each hands its
output to the next; a failing stage degrades to the all-extern plan; a stored artifact is tuned
with kernels from its request's front stages."""

from __future__ import annotations

import pytest
import torch
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core import pipeline
from fxcc.compiler_core.artifact import Artifact, manifest_from_json
from fxcc.compiler_core.wire import CompileRequest, SymbolSpec
from tests.compiler_core.helpers import run


def _request(fn, *inputs: torch.Tensor) -> CompileRequest:
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=core_aten_decompositions())(*inputs)
    return CompileRequest(graph=capture_graph(gm, list(inputs)).spec)


def test_the_stages_run_in_order_heard_and_timed_and_the_artifact_keeps_the_compile():
    request = _request(lambda a: (a.sin() * 2).sum(-1), torch.randn(8, 64))
    heard: list[str] = []
    c = pipeline.run(pipeline.Compilation(request, on_stage=heard.append))
    assert heard == ["rebuild", "passes", "lower", "schedule", "codegen", "package"]  # no GPU, nothing built
    assert [s.name for s in c.stages] == heard and all(s.seconds >= 0 for s in c.stages)
    assert pipeline.STAGES == ("rebuild", "passes", "lower", "schedule", "codegen", "tune", "build", "package")
    art = c.artifact
    assert art.manifest.stage_log is not None and art.manifest.stats.compile_s > 0
    assert set(c.scheduled()) == {k.name for k in art.manifest.kernels}
    assert c.value_dtypes() and set(c.value_dtypes()) >= {n.name for n in request.graph.nodes}
    x = torch.randn(8, 64)
    torch.testing.assert_close(run(art, x)[0], (x.sin() * 2).sum(-1))


def test_a_stage_that_fails_leaves_the_graph_to_extern_calls_and_skips_the_later_front_stages(monkeypatch):
    request = _request(lambda a: a.sin().cos(), torch.randn(4, 4))

    def broken(*args):
        raise RuntimeError("simulated lowering bug")

    monkeypatch.setattr(pipeline, "lower_graph", broken)
    heard: list[str] = []
    c = pipeline.run(pipeline.Compilation(request, on_stage=heard.append))
    assert heard == ["rebuild", "passes", "lower", "package"]
    assert c.extern_reason and "simulated lowering bug" in c.extern_reason
    assert c.artifact.manifest.kernels == [] and c.artifact.manifest.stats.nodes_extern == 2
    x = torch.randn(4, 4)
    torch.testing.assert_close(run(c.artifact, x)[0], x.sin().cos())


def test_a_stored_artifact_is_tuned_with_its_requests_kernels_rebuilt_with_its_hints(monkeypatch):
    request = _request(lambda a: (a * 3).sum(-1), torch.randn(2, 1100))
    art = pipeline.compile_request(request)
    stored = Artifact(manifest_from_json(art.manifest_json()), dict(art.blobs))
    given: dict = {}

    def tuner(artifact, request, device, *, scheduled=None):
        given.update(scheduled())
        return Artifact(artifact.manifest.model_copy(update={"tuned": True}), artifact.blobs)

    monkeypatch.setattr(pipeline, "autotune_for_target", tuner)
    heard: list[str] = []
    tuned = pipeline.retune(request, stored, "cuda:0", on_stage=heard.append)
    assert tuned.manifest.tuned and heard[0] == "tune"
    assert set(given) == {k.name for k in art.manifest.kernels}


def test_the_front_stages_of_a_symbolic_graph_share_one_shape_env_with_the_requests_hints():
    request = _request(lambda a: a.sin() + 1, torch.randn(8, 16))
    graph = request.graph
    p = graph.placeholders[0]
    sym = graph.model_copy(update={
        "symbols": [SymbolSpec(name="s0", lo=2)],
        "placeholders": [p.model_copy(update={"spec": p.spec.model_copy(update={"sizes": ["s0", 16]})})]})
    try:
        sym = type(graph).model_validate(sym.model_dump())
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"this wire form takes symbols differently: {e}")
    request = CompileRequest(graph=sym, hints={"s0": 12})
    c = pipeline.run(pipeline.Compilation(request), pipeline.FRONT)
    assert c.syms is not None and list(c.syms.hints.values()) == [12]
    assert c.artifact.manifest.plan.symbols and c.artifact.manifest.plan.symbols[0].name == "s0"


def test_the_build_reads_nested_control_flow_subgraphs_dtypes_from_the_compile(monkeypatch):
    from fxcc.compiler_core import build
    from fxcc.compiler_core.wire import CompileOptions, Target
    from tests.client.test_control_flow import _branch

    request = CompileRequest(graph=_branch(depth=3), options=CompileOptions(target=Target(kind="cuda", arch=90)))
    c = pipeline.run(pipeline.Compilation(request), pipeline.FRONT)
    dtypes = c.value_dtypes()
    nested = [k for k in dtypes if k.count("/") == 2]  # a leaf's values, two control flow nodes down
    assert nested and all(dtypes[k] == ("bool" if k.endswith("/p") else "float32") for k in nested)
    derived = build.kernel_signatures(c.artifact.manifest.plan, request)  # each subgraph rebuilt
    assert derived

    def no_rebuild(request):
        raise AssertionError("the build rebuilt a subgraph")

    monkeypatch.setattr(build, "_node_dtypes", no_rebuild)
    assert build.kernel_signatures(c.artifact.manifest.plan, request, dtypes) == derived
