"""The Dynamo backend in-process (no FXCC_URL): results match eager, fallbacks never crash."""

import warnings

import pytest
import torch

from fxcc.client import backend
from fxcc.client.examples import seed_workloads


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles):
    yield


@pytest.mark.parametrize("index", [0, 1, 2], ids=["cos_sin", "bias_gelu_ln", "transformer_block"])
def test_seed_workloads_match_eager(index):
    w = seed_workloads("cpu", small=True)[index]
    with torch.no_grad():
        expected = w.fn(*w.inputs)
        got = torch.compile(w.fn, backend="fxcc")(*w.inputs)
    torch.testing.assert_close(got, expected)
    assert got.stride() == expected.stride() and got.dtype == expected.dtype
    evs = backend.events()
    assert evs and all(e.source == "compiled-in-process" for e in evs)


def test_second_compile_hits_local_cache():
    f = seed_workloads("cpu", small=True)[0]
    with torch.no_grad():
        torch.compile(f.fn, backend="fxcc")(*f.inputs)
        torch._dynamo.reset()
        got = torch.compile(f.fn, backend="fxcc")(*f.inputs)
    torch.testing.assert_close(got, f.fn(*f.inputs))
    assert [e.source for e in backend.events()] == ["compiled-in-process", "local-hit"]


def test_training_forward_and_backward_match_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(8, 16)
    compiled = torch.compile(model, backend="fxcc")
    compiled(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert len([e for e in backend.events() if e.source != "fallback"]) == 2  # forward and backward


def test_unreachable_service_falls_back_to_eager_and_warns_once(monkeypatch):
    monkeypatch.setenv("FXCC_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    x = torch.randn(64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            torch._dynamo.reset()
            got = torch.compile(lambda t, i=i: torch.cos(torch.sin(t)) + i, backend="fxcc")(x)
            torch.testing.assert_close(got, torch.cos(torch.sin(x)) + i)
    fxcc_warnings = [w for w in caught if "fxcc" in str(w.message)]
    assert len(fxcc_warnings) == 1, [str(w.message) for w in fxcc_warnings]
    assert "unreachable" in str(fxcc_warnings[0].message)
    assert {e.source for e in backend.events()} == {"fallback"}


def test_fallback_error_mode_raises(monkeypatch):
    monkeypatch.setenv("FXCC_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    with pytest.raises(Exception, match="unreachable"):
        torch.compile(lambda t: t.sin(), backend="fxcc")(torch.randn(4))


def test_bad_option_is_a_clear_error():
    with pytest.raises(Exception, match="unknown fxcc options"):
        torch.compile(lambda t: t.sin(), backend="fxcc", options={"nonsense": 1})(torch.randn(4))


def test_non_blocking_runs_eagerly_then_switches(monkeypatch):
    monkeypatch.setenv("FXCC_BLOCKING", "0")
    x = torch.randn(256)
    f = torch.compile(lambda t: torch.cos(torch.sin(t)) * 2, backend="fxcc")
    expected = torch.cos(torch.sin(x)) * 2
    for _ in range(600):  # the compile finishes in the background; every call is right meanwhile
        torch.testing.assert_close(f(x), expected)
        if any(e.source == "compiled-in-process" for e in backend.events()):
            break
        import time
        time.sleep(0.05)
    assert [e.source for e in backend.events()] == ["compiled-in-process"]
    torch.testing.assert_close(f(x), expected)


def test_precompile_fills_the_cache_without_running_compiled(monkeypatch):
    monkeypatch.setenv("FXCC_PRECOMPILE", "1")
    x = torch.randn(32)
    torch.testing.assert_close(torch.compile(lambda t: t.sin() + 1, backend="fxcc")(x), x.sin() + 1)
    assert [e.source for e in backend.events()] == ["precompile-compiled"]
    monkeypatch.delenv("FXCC_PRECOMPILE")
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(lambda t: t.sin() + 1, backend="fxcc")(x), x.sin() + 1)
    assert backend.events()[-1].source == "local-hit"


def test_inductor_fallback(monkeypatch):
    monkeypatch.setenv("FXCC_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FXCC_FALLBACK", "inductor")
    x = torch.randn(64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(lambda t: t.sin() * 3, backend="fxcc")(x)
    torch.testing.assert_close(got, x.sin() * 3)
    assert any("with Inductor" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_bad_env_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("FXCC_BLOCKING", "maybe")
    with pytest.raises(Exception, match="FXCC_BLOCKING must be 0 or 1"):
        torch.compile(lambda t: t.sin(), backend="fxcc")(torch.randn(4))


def test_torch_compile_modes_reach_fxcc():
    """torch.compile(mode=...) hands fxcc `mode`: max-autotune compiles apart (another key: its
    kernels are tuned), reduce-overhead and default are the same compile (fxcc replays CUDA graphs
    by default), and a mode fxcc does not know is refused with its name."""
    from fxcc.client.settings import compile_options

    f = seed_workloads("cpu", small=True)[0]
    keys = {}
    with torch.no_grad():
        for mode in ("default", "reduce-overhead", "max-autotune"):
            torch._dynamo.reset()
            got = torch.compile(f.fn, backend="fxcc", mode=mode)(*f.inputs)
            torch.testing.assert_close(got, f.fn(*f.inputs))
            keys[mode] = backend.events()[-1].key
    assert keys["default"] == keys["reduce-overhead"] != keys["max-autotune"]
    assert compile_options({"mode": "max-autotune-no-cudagraphs"}) == {"mode": "max-autotune", "cuda_graphs": False}
    assert compile_options({"options": {"cuda_graphs": False}}) == {"cuda_graphs": False}
    with pytest.raises(ValueError, match="'fastest' is not one fxcc knows"):
        compile_options({"mode": "fastest"})


def test_decomposition_table_sees_later_registrations():
    """The table is cached per process, but a custom op registered later (with a
    CompositeImplicitAutograd kernel) and a decomposition replaced later are in the next one."""
    first = backend.decomposition_table()
    first.clear()  # each call hands out its own dict
    assert backend.decomposition_table()
    lib = torch.library.Library("fxcc_test_decomps", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
    assert torch.ops.fxcc_test_decomps.twice.default in backend.decomposition_table()

    from torch._decomp import global_decomposition_table

    addcmul = torch.ops.aten.addcmul.default
    post = global_decomposition_table["post_autograd"]
    original = post[addcmul]

    def replaced(*args, **kwargs):
        return original(*args, **kwargs)
    post[addcmul] = replaced
    try:
        assert backend.decomposition_table()[addcmul] is replaced
    finally:
        post[addcmul] = original
    assert backend.decomposition_table()[addcmul] is original
