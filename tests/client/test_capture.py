"""Capture: aten graphs become GraphSpecs that rebuild to the same computation."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.errors import ArtifactError, UnsupportedOp
from fxcc.compiler_core.graph import rebuild_graph
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest


def f(x, y):
    z = torch.nn.functional.layer_norm(x + y, (8,))
    return z.transpose(0, 1).contiguous(), torch.where(x > 0, x, 2.5).to(torch.float16)


def test_capture_rebuild_matches_shapes_and_runs():
    x, y = torch.randn(4, 8), torch.randn(8)
    gm = make_fx(f)(x, y)
    cap = capture_graph(gm, [x, y])
    rebuilt = rebuild_graph(cap.spec)
    ours = [n for n in rebuilt.graph.nodes if n.op == "call_function"]
    theirs = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [n.target for n in ours] == [n.target for n in theirs]
    art = compile_request(CompileRequest(graph=cap.spec))
    outs = load_plan(art)([x, y] + cap.constants)
    for got, exp in zip(outs, f(x, y)):
        torch.testing.assert_close(got, exp)
        assert got.stride() == exp.stride()


def test_constants_become_inputs():
    const = torch.tensor([1.0, 2.0, 3.0])

    def g(x):
        return x * const

    x = torch.randn(3)
    gm = make_fx(g)(x)
    cap = capture_graph(gm, [x])
    assert len(cap.constants) == 1 and len(cap.spec.placeholders) == 2
    art = compile_request(CompileRequest(graph=cap.spec))
    torch.testing.assert_close(load_plan(art)([x] + cap.constants)[0], g(x))


def test_symbolic_inputs_travel_as_size_symbols():
    gm = make_fx(lambda x: x.sin().reshape(-1, 1) * 2, tracing_mode="symbolic")(torch.randn(5))
    example = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    cap = capture_graph(gm, example)
    assert [s.name for s in cap.spec.symbols] == ["s0"] and cap.hints == {"s0": 5}
    assert cap.spec.placeholders[0].spec.sizes == ["s0"]
    art = compile_request(CompileRequest(graph=cap.spec, hints=cap.hints))
    runner = load_plan(art)
    for n in (3, 5, 40):  # one artifact, any size
        x = torch.randn(n)
        (out,) = runner([x])
        torch.testing.assert_close(out, x.sin().reshape(-1, 1) * 2)


def test_runtime_rejects_tampered_blobs():
    x = torch.randn(16)
    gm = make_fx(lambda t: torch.cos(torch.sin(t)))(x)
    art = compile_request(CompileRequest(graph=capture_graph(gm, [x]).spec))
    if not art.manifest.kernels:
        pytest.skip("this compiler build emits no kernels for cos(sin(x)) yet")
    digest = art.manifest.kernels[0].source.digest
    bad = Artifact(art.manifest, {**art.blobs, digest: art.blobs[digest] + b"\nimport os\n"})
    with pytest.raises(ArtifactError):
        load_plan(bad)


def test_what_cannot_travel_is_unsupported_not_an_error():
    x = torch.randn(4, dtype=torch.complex128)
    gm = make_fx(lambda t: t * 2)(x)
    with pytest.raises(UnsupportedOp, match="cannot travel"):
        capture_graph(gm, [x])


def test_dotted_string_arguments_travel():
    from pydantic import ValidationError

    from fxcc.compiler_core.wire import StrArg

    assert StrArg(value="linalg.solve").value == "linalg.solve"
    with pytest.raises(ValidationError):
        StrArg(value="a;b")
