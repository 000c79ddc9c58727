"""Run by tests/client/test_dynamo_skip.py as a script (a file, so that torch can hash its source):
`python dynamo_skip_child.py save|guards|trust`. Prints one JSON line of what happened per case."""

import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch._dynamo.utils as dynamo_utils

import fxcc
from fxcc.client import backend, dynamo_cache
from fxcc.client.settings import ClientSettings

sys.path.insert(0, str(Path(__file__).parent))
from dynamo_skip_decorators import as_tuple

FACTOR = 1.0


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)
        self.scale = 2.0

    def forward(self, x):
        return self.l2(torch.nn.functional.gelu(self.l1(x)) * self.scale) + FACTOR


def pointwise(x):
    return torch.sin(x) * 2 + 1


def other_fxcc(x):
    return torch.cos(x) * 3 - 1


def other_torch(x):
    return torch.exp(-x) + x


def foreign(x):
    return torch.tanh(x) + x


def tampered(x):
    return torch.sigmoid(x) * x


def lost_artifact(x):
    return torch.sigmoid(x) * 4


def with_options(x):
    return torch.cos(x) * x - 2


def for_aot_compile(x):
    return torch.relu(x) * 0.5 + x


def plus_one(x):
    return x + 1


def plus_two(x):
    return x + 2


ACT = plus_one  # a global function: Dynamo guards it by identity


def uses_act(x):
    return torch.sin(ACT(x))


def uses_act_eager(x):
    return torch.cos(ACT(x))


class Decorated(torch.nn.Module):
    """A model whose forward is wrapped by a decorator of another module."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    @as_tuple
    def forward(self, x):
        return torch.tanh(self.lin(x))


class Act(torch.nn.Module):
    """A module holding a function (`self.act`), as models pick their activation."""

    def __init__(self, act) -> None:
        super().__init__()
        self.act = act

    def forward(self, x):
        return self.act(x) * 2


def call(fn, *args, grad: bool = False):
    """(result, frames Dynamo traced, graphs handed to fxcc's backend) of one call."""
    frames, graphs = dynamo_utils.counters["frames"]["ok"], len(backend.events())
    with torch.set_grad_enabled(grad):
        out = fn(*args)
    return out, dynamo_utils.counters["frames"]["ok"] - frames, len(backend.events()) - graphs


def case(out: dict, name: str, fn, eager, *args, grad: bool = False) -> None:
    got, traced, graphs = call(fn, *args, grad=grad)
    with torch.set_grad_enabled(grad):
        expected = eager(*args)
    torch.testing.assert_close(got, expected)
    out[name] = {"traced": traced, "graphs": graphs, "counters": dynamo_cache.counters()}


torch.manual_seed(0)
net = Net().eval()
x, x6 = torch.randn(4, 16), torch.randn(6, 16)
phase, aot_path = sys.argv[1], Path(os.environ["FXCC_CACHE_DIR"]).parent / "aot_compiled.bin"
out: dict = {}
if phase == "save":
    case(out, "net", torch.compile(net, backend="fxcc"), net, x)
    for fn in (pointwise, other_fxcc, other_torch, foreign, tampered, lost_artifact):
        case(out, fn.__name__, torch.compile(fn, backend="fxcc"), fn, x)
    case(out, "with_options", torch.compile(with_options, backend="fxcc", options={"cuda_graphs": False}),
         with_options, x)
    case(out, "uses_act", torch.compile(uses_act, backend="fxcc"), uses_act, x)
    decorated = Decorated()
    case(out, "decorated", torch.compile(decorated, backend="fxcc"), decorated, x)
    gelu = Act(torch.nn.functional.gelu)
    case(out, "module_function", torch.compile(gelu, backend="fxcc"), gelu, x)
    full = torch.compile(for_aot_compile, backend="fxcc", fullgraph=True)
    if hasattr(full, "aot_compile"):  # torch 2.13 has it, 2.11 does not
        aot = full.aot_compile(((x,), {}))
        aot.save_compiled_function(str(aot_path))
elif phase == "guards":
    compiled = torch.compile(net, backend="fxcc")
    case(out, "hit", compiled, net, x)
    case(out, "shape", compiled, net, x6)
    case(out, "grad_mode", compiled, net, x, grad=True)
    net.scale = 3.0
    case(out, "module_attribute", compiled, net, x)
    net.scale = 2.0
    FACTOR = 5.0
    case(out, "global", compiled, net, x)
    FACTOR = 1.0
    case(out, "back_to_saved", compiled, net, x)
    compiled_pointwise = torch.compile(pointwise, backend="fxcc")
    case(out, "pointwise_hit", compiled_pointwise, pointwise, x)
    case(out, "dtype", compiled_pointwise, pointwise, x.double())
    if torch.cuda.is_available():
        case(out, "device", compiled_pointwise, pointwise, x.cuda())
    # identity guards travel with the package: another function where the saved one was traces
    ACT = plus_two
    compiled_act = torch.compile(uses_act, backend="fxcc")
    case(out, "rebound_function", compiled_act, uses_act, x)
    ACT = plus_one
    case(out, "function_back", compiled_act, uses_act, x)
    decorated = Decorated()
    case(out, "decorated_hit", torch.compile(decorated, backend="fxcc"), decorated, x)
    relu = Act(torch.nn.functional.relu)
    case(out, "module_function_other", torch.compile(relu, backend="fxcc"), relu, x)
    # another backend's frames keep Dynamo's identity guards while fxcc's cache is on
    eager_compiled = torch.compile(uses_act_eager, backend="eager")
    first = eager_compiled(x)
    ACT = plus_two
    out["other_backend"] = {"noticed": bool(torch.allclose(eager_compiled(x), torch.cos(x + 2))),
                            "first_right": bool(torch.allclose(first, torch.cos(x + 1)))}
    ACT = plus_one
    if aot_path.exists():
        with open(aot_path, "rb") as f:
            loaded = torch.compiler.load_compiled_function(f)
        case(out, "aot_compile_loaded", loaded, for_aot_compile, x, grad=True)
elif phase == "trust":
    real_fxcc = fxcc.version.__version__
    fxcc.version.__version__ = real_fxcc + "+another"
    case(out, "fxcc_version", torch.compile(other_fxcc, backend="fxcc"), other_fxcc, x)
    fxcc.version.__version__ = real_fxcc
    from fxcc.client import pre_aot

    real_torch = torch.__version__
    torch.__version__ = real_torch + "+another"
    pre_aot._versions.cache_clear()
    case(out, "torch_version", torch.compile(other_torch, backend="fxcc"), other_torch, x)
    torch.__version__ = real_torch
    pre_aot._versions.cache_clear()
    own_key = os.environ["FXCC_PACKAGE_KEY_FILE"]
    os.environ["FXCC_PACKAGE_KEY_FILE"] = str(Path(own_key).parent / "another-principal.key")
    case(out, "foreign_key", torch.compile(foreign, backend="fxcc"), foreign, x)
    os.environ["FXCC_PACKAGE_KEY_FILE"] = own_key
    settings = ClientSettings.from_env()
    path = settings.cache_dir / "dynamo" / f"{dynamo_cache.package_key(tampered, dynamo_cache.settings_key(settings))}.pkg"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x55
    path.write_bytes(bytes(data))
    case(out, "tampered", torch.compile(tampered, backend="fxcc"), tampered, x)
    # torch.compile's options are part of the key: another mode misses, the same ones hit
    case(out, "other_mode", torch.compile(with_options, backend="fxcc",
                                          options={"cuda_graphs": False, "mode": "max-autotune"}), with_options, x)
    case(out, "same_options", torch.compile(with_options, backend="fxcc", options={"cuda_graphs": False}),
         with_options, x)
    # the package verifies, its artifact is gone from the local cache (last: every artifact goes)
    shutil.rmtree(settings.cache_dir / "artifacts" / "manifests")
    case(out, "lost_artifact", torch.compile(lost_artifact, backend="fxcc"), lost_artifact, x)
print(json.dumps(out))
