"""torch.library custom ops in compiled graphs (in-process): the op runs as an opaque extern step
by its qualified name, the rest of the graph is fused around it, and a fake kernel that lies makes
that graph fall back once, with a message."""

import warnings

import pytest
import torch

from fxcc.client import backend
from fxcc.client.capture import capture_graph
from fxcc.client.opaque_ops import resolve_opaque
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.artifact import ExternStep
from fxcc.compiler_core.errors import ArtifactError
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest, IntArg, StrArg


@torch.library.custom_op("fxcc_test::scale", mutates_args=())
def scale(x: torch.Tensor, k: int, group: str) -> torch.Tensor:
    return x * k if group == "times" else x + k


@scale.register_fake
def _(x, k, group):
    return torch.empty_like(x)


@torch.library.custom_op("fxcc_test::split_halves", mutates_args=())
def split_halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[0] // 2
    return x[:n].clone(), x[n:].clone() * 2


@split_halves.register_fake
def _(x):
    n = x.shape[0] // 2
    return x.new_empty((n, *x.shape[1:])), x.new_empty((x.shape[0] - n, *x.shape[1:]))


@torch.library.custom_op("fxcc_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, -x])


@twice.register_fake
def _(x):
    return x.new_empty((2 * x.shape[0], *x.shape[1:]))


@torch.library.custom_op("fxcc_test::accumulate", mutates_args=("out",))
def accumulate(x: torch.Tensor, out: torch.Tensor) -> None:
    out.add_(x * 3)


@accumulate.register_fake
def _(x, out):
    return None


@torch.library.custom_op("fxcc_test::liar", mutates_args=())
def liar(x: torch.Tensor) -> torch.Tensor:
    return x[:-1] * 2  # one row fewer than its fake kernel says


@liar.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles, monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    yield


def _compiled(fn, *args, dynamic=None):
    with torch.no_grad():
        return torch.compile(fn, backend="fxcc", dynamic=dynamic)(*args)


def _plans():
    return [e for e in backend.events() if e.source != "fallback"]


def test_custom_op_runs_by_name_and_the_rest_fuses():
    def f(x):
        return scale(x.sin() * x, 3, "times").cos() + x

    x = torch.randn(16, 8)
    torch.testing.assert_close(_compiled(f, x), f(x))
    (event,) = _plans()
    assert event.source == "compiled-in-process"
    assert event.stats.extern_ops == ["fxcc_test.scale.default"]
    assert event.stats.kernels == 2  # sin*x before the op, cos+x after it
    assert event.stats.ops_fused >= 2


def _spec(fn, *args):
    """The GraphSpec fxcc's capture makes of `fn`'s (one) aten graph."""
    from torch._dynamo.backends.common import aot_autograd

    captured = []

    def grab(gm, example_inputs):
        captured.append(capture_graph(gm, example_inputs))
        return gm

    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=grab))(*args)
    return captured[0].spec


def test_string_and_int_arguments_travel_as_data():
    spec = _spec(lambda x: scale(x.sin(), 5, "plus"), torch.randn(4))
    (node,) = [n for n in spec.nodes if n.opaque is not None]
    assert node.target == "fxcc_test.scale.default"
    assert node.args[1:] == [IntArg(value=5), StrArg(value="plus")]
    assert node.opaque.op_schema == str(torch.ops.fxcc_test.scale.default._schema)
    assert node.opaque.outputs[0].sizes == [4]


def test_multi_output_custom_op():
    def f(x):
        a, b = split_halves(x.exp())
        return a.sin() + b

    x = torch.randn(8, 4)
    torch.testing.assert_close(_compiled(f, x), f(x))
    (event,) = _plans()
    assert event.stats.extern_ops == ["fxcc_test.split_halves.default"] and event.stats.kernels == 2


def test_mutating_custom_op_is_functionalized():
    def f(x):
        o = x.cos()
        accumulate(x, o)
        return o.sin()

    x = torch.randn(32)
    before = x.clone()
    torch.testing.assert_close(_compiled(f, x), f(x))
    torch.testing.assert_close(x, before)  # only the intermediate was written
    (event,) = _plans()
    assert event.stats.extern_ops == ["fxcc_test.accumulate.default"] and event.stats.kernels == 2


def test_mutating_custom_op_writes_a_graph_input_back():
    def f(x, y):
        accumulate(x, y)
        return y.sin()

    x, y = torch.randn(32), torch.randn(32)
    y_eager = y.clone()
    expected = f(x, y_eager)
    got = _compiled(f, x, y)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(y, y_eager)  # the input was mutated exactly as eager does
    assert "fxcc_test.accumulate.default" in _plans()[0].stats.extern_ops


def test_symbolic_sizes():
    def f(x):
        return scale(twice(x * 2).exp(), 2, "times").relu() - 1

    fn = torch.compile(f, backend="fxcc", dynamic=True)
    with torch.no_grad():
        for n in (6, 10, 14):
            x = torch.randn(n, 3)
            torch.testing.assert_close(fn(x), f(x))
    (event,) = _plans()  # one plan serves every size: its output specs are size expressions
    assert event.stats.extern_ops == ["fxcc_test.scale.default", "fxcc_test.twice.default"]
    assert event.stats.kernels == 3  # x*2, exp and relu-1 between the two ops


def test_lying_fake_kernel_falls_back_once_with_a_message(monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "eager")

    def f(x):
        return liar(x.sin()).cos()

    x = torch.randn(6, 4)
    fn = torch.compile(f, backend="fxcc")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        first, second = fn(x), fn(x)
    torch.testing.assert_close(first, f(x))
    torch.testing.assert_close(second, f(x))
    messages = [str(w.message) for w in caught if "fxcc" in str(w.message)]
    assert len(messages) == 1, messages
    assert "fxcc_test.liar.default" in messages[0] and "fake kernel said" in messages[0]


def _artifact():
    return compile_request(CompileRequest(graph=_spec(lambda x: scale(x.sin(), 2, "times"), torch.randn(4))))


def test_plan_naming_another_schema_is_refused():
    art = _artifact()
    plan = art.manifest.plan
    steps = [s.model_copy(update={"opaque": s.opaque.model_copy(update={
        "op_schema": "fxcc_test::scale(Tensor x, int k, str group, int extra=0) -> Tensor"})})
        if isinstance(s, ExternStep) and s.opaque is not None else s for s in plan.steps]
    forged = type(art)(art.manifest.model_copy(update={"plan": plan.model_copy(update={"steps": steps})}), art.blobs)
    with pytest.raises(ArtifactError, match="the plan was compiled for"):
        load_plan(forged)
    torch.testing.assert_close(load_plan(art)([torch.ones(4)])[0], torch.ones(4).sin() * 2)


def test_unregistered_or_non_opaque_names_are_refused():
    with pytest.raises(ArtifactError, match="not registered"):
        resolve_opaque("fxcc_test.nothing.default", "fxcc_test::nothing(Tensor x) -> Tensor")
    with pytest.raises(ArtifactError, match="not an opaque op"):
        resolve_opaque("aten.sin.default", str(torch.ops.aten.sin.default._schema))
    with pytest.raises(ArtifactError, match="not an opaque op"):
        resolve_opaque("os.system.__call__", "os::system(str cmd) -> Tensor")


@torch.library.custom_op("fxcc_test::cube", mutates_args=())
def cube(x: torch.Tensor) -> torch.Tensor:
    return x * x * x


@cube.register_fake
def _(x):
    return torch.empty_like(x)


def _cube_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * 3 * scale(x, 1, "times") * x  # the backward calls a custom op too


cube.register_autograd(_cube_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


def test_training_through_a_custom_op_with_autograd():
    w = torch.randn(8, requires_grad=True)
    x = torch.randn(4, 8)

    def loss(w, x):
        return cube((x * w).sin()).cos().sum()

    loss(w, x).backward()
    expected, w.grad = w.grad.clone(), None
    torch.compile(loss, backend="fxcc")(w, x).backward()
    torch.testing.assert_close(w.grad, expected)
    forward, backward = _plans()
    assert forward.stats.extern_ops == ["fxcc_test.cube.default"]
    assert "fxcc_test.scale.default" in backward.stats.extern_ops and backward.stats.kernels >= 1
