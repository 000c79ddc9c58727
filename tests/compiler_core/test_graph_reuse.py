"""A pass rewrites the graph in place, keeping what it left alone; the build reads the compile's dtypes."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core import build
from fxcc.compiler_core.errors import InvalidGraph
from fxcc.compiler_core.graph import propagate_shapes, rebuild_graph, wire_graph
from fxcc.compiler_core.passes.edit import repropagate
from fxcc.compiler_core.passes.pad_mm import pad_matmuls
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, IntArg, Target


def _spec(fn, *inputs):
    return capture_graph(make_fx(fn)(*inputs), list(inputs)).spec


def _net(x, w):
    side = torch.sin(x) * 2  # nothing the padding touches reads or feeds this
    y = torch.mm(x, w.t())  # N = 4099: padded on a CUDA target
    return y.t() + 1, side


def _meta(val):
    return tuple(val.shape), tuple(val.stride()), val.dtype


def test_a_pass_rewrites_in_place_keeping_untouched_values_and_propagating_the_rest_again():
    x, w = torch.randn(1024, 64), torch.randn(4099, 64)
    spec = _spec(_net, x, w)
    gm = rebuild_graph(spec)
    old = {n.name: n.meta["val"] for n in gm.graph.nodes if n.op != "output"}
    mode = gm.meta["fxcc_fake_mode"]
    assert pad_matmuls(gm, "cuda")
    new_spec = wire_graph(gm, spec)
    assert new_spec is not spec and gm.meta["fxcc_fake_mode"] is mode
    fresh = {n.name: n.meta["val"] for n in rebuild_graph(new_spec).graph.nodes if n.op != "output"}
    new = {n.name: n.meta["val"] for n in gm.graph.nodes if n.op != "output"}
    assert new.keys() == fresh.keys()
    for name, val in new.items():  # the same facts as a rebuild from scratch, node by node
        assert _meta(val) == _meta(fresh[name]), name
    sin = next(n for n in new_spec.nodes if n.target == "aten.sin.default")
    assert sin in spec.nodes and any(n is sin for n in spec.nodes)  # its wire node kept, not encoded again
    first = spec.placeholders[0].name
    assert new[sin.name] is old[sin.name] and new[first] is old[first]  # kept, not propagated again
    mm = next(n.name for n in spec.nodes if n.target == "aten.mm.default")
    t = next(n.name for n in spec.nodes if n.target == "aten.t.default" and n.args[0].name == mm)
    assert new[mm] is not old[mm]  # now the slice of the padded matmul
    assert new[t] is not old[t] and _meta(new[t])[1] == (1, 4100) != _meta(old[t])[1]  # its reader follows
    torch.testing.assert_close(gm(x, w)[0], _net(x, w)[0])


def test_a_changed_argument_is_encoded_and_its_readers_propagated_again():
    x = torch.randn(8, 6)
    spec = _spec(lambda a: torch.sum(a, [1]) + 1, x)
    gm = rebuild_graph(spec)
    total = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.sum.dim_IntList)
    total.args = (total.args[0], [0])
    repropagate(gm, {total})
    assert sorted(tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.op != "output") == [(6,), (6,), (8, 6)]
    new_spec = wire_graph(gm, spec)
    (changed,) = [n for n in new_spec.nodes if not any(n is m for m in spec.nodes)]
    assert changed.name == total.name and changed.args[1].items == [IntArg(value=0)]


def test_the_request_check_propagates_as_the_rebuild_does():
    spec = _spec(lambda a, b: torch.mm(a, b), torch.randn(4, 3), torch.randn(3, 5))
    propagate_shapes(spec)  # fits
    bad = spec.model_copy(update={"placeholders": [
        spec.placeholders[0], spec.placeholders[1].model_copy(update={"spec": spec.placeholders[0].spec})]})
    with pytest.raises(InvalidGraph) as checked:
        propagate_shapes(bad)
    with pytest.raises(InvalidGraph) as rebuilt:
        rebuild_graph(bad)
    assert checked.value.node == rebuilt.value.node == spec.nodes[0].name


def test_the_build_stage_reads_the_compiles_dtypes_instead_of_rebuilding(monkeypatch):
    from fxcc.compiler_core import pipeline

    x, w = torch.randn(1024, 64), torch.randn(4099, 64)
    request = CompileRequest(graph=_spec(_net, x, w),
                             options=CompileOptions(target=Target(kind="cuda", arch=90)))
    front = pipeline.run(pipeline.Compilation(request), pipeline.FRONT)
    art = front.artifact
    assert art.manifest.kernels and front.value_dtypes()
    derived = build.kernel_signatures(art.manifest.plan, request)  # from a rebuild, passes included
    assert derived and build.kernel_signatures(art.manifest.plan, request, front.value_dtypes()) == derived

    def no_rebuild(request):
        raise AssertionError("the build rebuilt the graph")

    monkeypatch.setattr(build, "_node_dtypes", no_rebuild)
    monkeypatch.setattr(build, "cuda_build_unavailable", lambda: None)  # tasks are made without Triton's CUDA
    monkeypatch.setattr(pipeline, "cuda_build_unavailable", lambda: None)
    c = pipeline.run(pipeline.Compilation(request, build="tasks"))
    assert [s.name for s in c.stages] == ["rebuild", "passes", "lower", "schedule", "codegen", "build", "package"]
    assert {t.name for t in c.tasks} == set(derived)
    assert all(t.types == derived[t.name].types for t in c.tasks)


def test_tuning_reads_the_compiles_kernels_and_tunes_a_stored_artifact_alike(monkeypatch):
    from fxcc.compiler_core import autotune, pipeline
    from fxcc.compiler_core.artifact import Artifact, manifest_from_json

    x, y = torch.randn(2, 1100), torch.randn(1000)
    spec = _spec(lambda a, b: (a.sum(-1) * 3, b.sin() * 2), x, y)
    request = CompileRequest(graph=spec)
    c = pipeline.run(pipeline.Compilation(request))
    art = c.artifact
    assert set(c.scheduled()) == {k.name for k in art.manifest.kernels}
    stored = Artifact(manifest_from_json(art.manifest_json()), dict(art.blobs))  # as a tune job gets it

    def timer(config, launch):
        return config.xblock + config.num_warps / 100  # small tiles win: not the heuristic's

    tune_job = pipeline.Compilation(request, artifact=stored, record=False)
    from_stored = autotune.autotune_artifact(stored, request, "cpu", scheduled=tune_job.scheduled, timer=timer)
    assert tune_job._front is not None  # its kernels came from the request's front stages, run again
    monkeypatch.setattr(pipeline.Compilation, "front", lambda self: pytest.fail("lowered the graph again"))
    in_process = autotune.autotune_artifact(art, request, "cpu", scheduled=c.scheduled, timer=timer)
    assert in_process.manifest.tuned and from_stored.manifest.tuned
    same = {"stats": None}
    assert in_process.manifest.model_copy(update=same) == from_stored.manifest.model_copy(update=same)
    assert in_process.blobs == from_stored.blobs
