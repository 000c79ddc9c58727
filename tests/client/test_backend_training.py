"""Training through the backend: the min-cut partition, when the backward compiles, and what travels."""

import base64
import json
import warnings

import httpx
import pytest
import torch
from torch._functorch import partitioners

from fxcc.client import backend
from fxcc.client.remote import RemoteService


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles):
    yield


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def pointwise_chain(x: torch.Tensor) -> torch.Tensor:
    return ((x.sin() * 2).cos() + 1).exp()


def backward_inputs(monkeypatch, fn, x) -> list[torch.Tensor]:
    """Run fn(x) forward and backward through fxcc; the example inputs of its backward graph
    (the activations the forward saved, then the incoming gradient)."""
    seen = []
    compile_graph = backend.GraphCompiler.__call__

    def spy(self, gm, example_inputs):
        seen.append(example_inputs)
        return compile_graph(self, gm, example_inputs)

    monkeypatch.setattr(backend.GraphCompiler, "__call__", spy)
    torch._dynamo.reset()
    torch.compile(fn, backend="fxcc")(x).sum().backward()
    monkeypatch.setattr(backend.GraphCompiler, "__call__", compile_graph)
    assert len(seen) == 2  # forward, backward
    return seen[1]


def test_min_cut_partition_saves_fewer_bytes_than_the_default_partition(monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    x = torch.randn(256, requires_grad=True)
    pointwise_chain(x).sum().backward()
    expected, x.grad = x.grad, None

    ours = backward_inputs(monkeypatch, pointwise_chain, x)
    got, x.grad = x.grad, None
    monkeypatch.setattr(backend, "partition_joint_graph", partitioners.default_partition)
    default = backward_inputs(monkeypatch, pointwise_chain, x)

    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x.grad, expected)
    nbytes = [sum(t.nbytes for t in inputs) for inputs in (ours, default)]
    # The default partition saves the chain's intermediates; min-cut recomputes them from x.
    assert nbytes[0] < nbytes[1], nbytes


def test_dropout_backward_uses_the_forwards_mask(monkeypatch):
    # min-cut may recompute cheap ops in the backward, but never a random one: the backward of
    # dropout must see the forward's mask. With x = 1, the output is mask / (1 - p) and so is
    # the gradient of its sum.
    monkeypatch.setenv("FXCC_FALLBACK", "error")

    def f(x):
        return torch.nn.functional.dropout(x.sin().asin(), p=0.5, training=True)

    x = torch.ones(4096, requires_grad=True)
    out = torch.compile(f, backend="fxcc")(x)
    out.sum().backward()
    assert 0 < out.count_nonzero() < x.numel()
    torch.testing.assert_close(x.grad, out.detach())
    assert [e.source for e in backend.events()] == ["compiled-in-process"] * 2


def test_a_failing_min_cut_falls_back_to_the_default_partition(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no min-cut today")

    monkeypatch.setattr(partitioners, "min_cut_rematerialization_partition", broken)
    model, ref, x = mlp(), mlp(), torch.randn(8, 16)
    with pytest.warns(RuntimeWarning, match="min-cut partition failed"):
        torch.compile(model, backend="fxcc")(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert [e.source for e in backend.events()] == ["compiled-in-process"] * 2


def test_backward_compiles_at_the_first_backward_with_static_shapes():
    compiled = torch.compile(mlp(), backend="fxcc")
    loss = compiled(torch.randn(8, 16)).sum()
    assert len(backend.events()) == 1  # the forward only
    loss.backward()
    assert len(backend.events()) == 2
    compiled(torch.randn(8, 16)).sum().backward()
    assert len(backend.events()) == 2  # both graphs reused


def test_backward_compiles_with_the_forward_when_sizes_are_symbolic():
    # AOTAutograd compiles the backward at once when it saves symbolic sizes for it (it wants
    # the backward's guards before the first run). Counted whatever the graphs' outcome: this is
    # about when fxcc is asked, not what it answers.
    compiled = torch.compile(mlp(), backend="fxcc", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # symbolic graphs may still run eagerly, with a warning
        compiled(torch.randn(8, 16))
    assert len(backend.events()) == 2


class FakeService:
    """Stands in for the service's HTTP answers and keeps every request body the client sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def request(self, method: str, path: str, **kw) -> httpx.Response:
        content = kw.get("content") or b""
        self.bodies.append(content.encode() if isinstance(content, str) else content)
        if method == "GET" and path.startswith("/v1/artifacts/"):
            return httpx.Response(404, json={"detail": "not cached"})
        return httpx.Response(503, json={"detail": "no workers in this test"})


def numbers(obj) -> list[float]:
    """Every number in a parsed JSON document."""
    if isinstance(obj, dict):
        return [v for x in obj.values() for v in numbers(x)]
    if isinstance(obj, list):
        return [v for x in obj for v in numbers(x)]
    return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def leaked_values(body: bytes, tensors: list[torch.Tensor]) -> list[str]:
    """Which tensors' values the body carries: as JSON numbers, or as raw or base64 bytes."""
    text = body.decode() if body else "{}"
    sent = set(numbers(json.loads(text)))
    leaks = []
    for t in tensors:
        raw = t.detach().contiguous().numpy().tobytes()
        if any(float(v) in sent for v in t.detach().flatten().tolist()):
            leaks.append(f"{tuple(t.shape)} as numbers")
        if raw in body or base64.b64encode(raw) in body:
            leaks.append(f"{tuple(t.shape)} as bytes")
    return leaks


def test_parameters_never_travel_only_their_specs(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4))
    # Values no graph would hold by chance: 4096.0625, 4096.125, ... (exact in float32).
    state = list(model.parameters()) + [model[1].running_mean, model[1].running_var]
    with torch.no_grad():
        for i, t in enumerate(state):
            t.copy_(4096 + 0.0625 * (torch.arange(t.numel()) + 1 + 64 * i).reshape(t.shape))
    initial = [t.detach().clone() for t in state]  # training updates the BatchNorm statistics
    service = FakeService()
    monkeypatch.setattr(RemoteService, "_request", lambda remote, *args, **kw: service.request(*args, **kw))
    monkeypatch.setenv("FXCC_URL", "http://fxcc.invalid")
    x = torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="running a graph eagerly"):
        torch.compile(model, backend="fxcc")(x).sum().backward()
    torch._dynamo.reset()
    model.eval()
    with torch.no_grad():
        torch.compile(model, backend="fxcc")(x)

    posts = [json.loads(b) for b in service.bodies if b]
    assert len(posts) == 3  # training's forward and backward graphs, then an inference graph
    # The scanner finds values that are there, so that finding none below means something.
    assert leaked_values(json.dumps({"v": state[0].tolist()}).encode(), state[:1])
    for body in service.bodies:
        assert leaked_values(body, initial + state) == []
    specs = [p["spec"]["sizes"] for p in posts[0]["graph"]["placeholders"]]
    for p in model.parameters():
        assert list(p.shape) in specs  # the parameters' specs did travel


def test_cross_entropy_saves_its_logits_not_a_log_softmax_of_their_size(monkeypatch):
    """log_softmax is decomposed in training graphs, as Inductor's table does: the backward
    recomputes it from the logits (an input it saves, no new tensor) and two per-row statistics,
    where the whole op's [rows, classes] output was saved before (GPT-2's loss: 393 MB)."""
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    torch.manual_seed(0)
    logits = torch.randn(64, 1000, requires_grad=True)
    target = torch.randint(0, 1000, (64,))

    def loss(z):
        return torch.nn.functional.cross_entropy(z, target)

    loss(logits).backward()
    expected, logits.grad = logits.grad, None
    saved = []

    def pack(t):
        saved.append((t.untyped_storage().data_ptr(), t.numel()))
        return t

    torch._dynamo.reset()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = torch.compile(loss, backend="fxcc")(logits)
    out.backward()
    torch.testing.assert_close(logits.grad, expected)
    assert [e.source for e in backend.events()] == ["compiled-in-process"] * 2
    big = [ptr for ptr, n in saved if n >= logits.numel()]
    assert big == [logits.untyped_storage().data_ptr()], saved  # the logits themselves, nothing new
    assert sum(n for _, n in saved if n < logits.numel()) <= 4 * logits.shape[0] + 8  # row statistics, target

    # inference graphs keep the op whole (no joint graph to partition)
    assert backend.decomposition_table().keys() < backend.decomposition_table(training=True).keys()
    assert torch.ops.aten._log_softmax.default in backend.decomposition_table(training=True)
    assert torch.ops.aten._log_softmax.default not in backend.decomposition_table()


def test_a_max_pool_backward_saves_no_copy_of_its_input(monkeypatch):
    """A max pool's backward reads its input for the gradient's shape alone: the partition gets an
    uninitialized tensor of that layout in its place, so the stem's ReLU output (a ResNet's largest
    activation) is not saved for it; the gradients are eager's."""
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    torch.manual_seed(0)
    stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2))
    x = torch.randn(4, 3, 16, 16)

    def fn(x):
        return stem(x)

    fn(x).sum().backward()
    expected = [p.grad.clone() for p in stem.parameters()]

    def saved_float_bytes():
        for p in stem.parameters():
            p.grad = None
        inputs = backward_inputs(monkeypatch, fn, x)
        for got, want in zip([p.grad for p in stem.parameters()], expected):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        return sum(t.nbytes for t in inputs if isinstance(t, torch.Tensor) and t.dtype == torch.float32)

    ours = saved_float_bytes()
    monkeypatch.setattr(backend, "SHAPE_ONLY_ARG", {})
    before = saved_float_bytes()
    relu_out = 4 * 8 * 16 * 16 * 4
    assert before - ours >= relu_out, (before, ours)  # the ReLU's output, no longer saved
