"""Run by tests/client/test_package_load.py as a script (a file, so that torch can hash its source):
`python package_load_child.py save|side|error|deferred`. Prints one JSON line of what happened."""

import json
import logging
import sys
import threading

import torch
import torch._dynamo.utils as dynamo_utils
from torch import nn

from fxcc.client import backend, dynamo_cache

WAIT_S = 30.0  # how long a guard build waits for the side thread's plans (they come in milliseconds)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))

    def forward(self, x):
        return self.body(x).softmax(-1)


def failing_one(x):
    return torch.sin(x) * 3 + 1


def failing_two(x):
    return torch.cos(x) * 2 - 1


def first_call(fn, *args) -> tuple:
    """(result, frames Dynamo traced) of a call under no_grad."""
    frames = dynamo_utils.counters["frames"]["ok"]
    with torch.no_grad():
        out = fn(*args)
    return out, dynamo_utils.counters["frames"]["ok"] - frames


def record_plans() -> tuple[list[str], threading.Event]:
    """The names of the threads that build plans, and an event set once one was built."""
    threads: list[str] = []
    built = threading.Event()
    plan = dynamo_cache.BackendArtifact.plan

    def recording(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        try:
            return plan(self, *args, **kwargs)
        finally:
            built.set()

    dynamo_cache.BackendArtifact.plan = recording
    return threads, built


torch.manual_seed(0)
net = Net().eval()
x = torch.randn(4, 16)
phase = sys.argv[1]
out: dict = {}
if phase == "save":
    for name, fn in (("net", net), ("failing_one", failing_one), ("failing_two", failing_two)):
        _, traced = first_call(torch.compile(fn, backend="fxcc"), x)
        out[name] = traced
    out["counters"] = dynamo_cache.counters()
elif phase == "side":
    # Each guard manager torch builds for the package waits until a plan was built: only a side
    # thread that builds plans while the guards are built lets it go on before WAIT_S.
    from torch._dynamo import package as pk

    threads, built = record_plans()
    load_guard_manager = pk.load_guard_manager
    during: list[bool] = []

    def waiting(*args, **kwargs):
        during.append(built.wait(WAIT_S))
        return load_guard_manager(*args, **kwargs)

    pk.load_guard_manager = waiting
    compiled = torch.compile(net, backend="fxcc")
    pk.load_guard_manager = load_guard_manager
    got, traced = first_call(compiled, x)
    with torch.no_grad():
        torch.testing.assert_close(got, net(x))
    out.update(traced=traced, graphs=len(backend.events()), sources=[e.source for e in backend.events()],
               plan_threads=threads, built_during_guards=during,
               timings=dynamo_cache.load_timings(), counters=dynamo_cache.counters(),
               main=threading.current_thread().name)
elif phase == "error":
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logging.getLogger("fxcc").addHandler(Collect())
    logging.getLogger("fxcc").setLevel(logging.INFO)
    threads: list[str] = []

    def failing(*args, **kwargs):
        threads.append(threading.current_thread().name)
        raise RuntimeError("the side thread failed for the test")

    dynamo_cache.load_plan_for = failing
    for name, fn in (("failing_one", failing_one), ("failing_two", failing_two)):
        got, traced = first_call(torch.compile(fn, backend="fxcc"), x)
        torch.testing.assert_close(got, fn(x))
        out[name] = traced
    out.update(threads=threads, counters=dynamo_cache.counters(),
               messages=[m for m in messages if "the side thread failed for the test" in m])
elif phase == "deferred":
    from fxcc.client.cache import LocalCache
    from fxcc.client.settings import ClientSettings

    settings = ClientSettings.from_env()
    cache = LocalCache(settings.cache_dir)

    def stored() -> dict:
        return {"artifacts": sum(cache.get(e.key) is not None for e in backend.events()),
                "packages": len(list((settings.cache_dir / "dynamo").glob("*.pkg")))}

    compiled = torch.compile(net, backend="fxcc")
    before = stored()  # the package's graphs are loaded by now (backend.events), from the service
    got, traced = first_call(compiled, x)
    with torch.no_grad():
        torch.testing.assert_close(got, net(x))
    joined = dynamo_cache.join_loads(WAIT_S)
    out.update(traced=traced, sources=[e.source for e in backend.events()], before=before, after=stored(),
               joined=joined, counters=dynamo_cache.counters())
print(json.dumps(out))
