"""A frame recorded into fxcc's Dynamo package has its guards built once (client/dynamo_precompile.py,
`_patch_guards`), as without a package, and loses nothing by it: the tracing process keeps every
guard (a reassigned global function traces again there), and the package's guards are those torch's
own caching precompile saves (`_guards_twice`, the former way: the same guards, the same identity
guards carried), so that a new process runs from it and traces on a failing guard.

In child processes: the Dynamo-skip cache is on there (the test session turns it off)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]

CHILD = r"""
import inspect, json, os, pickle, sys
import torch
from torch._dynamo import convert_frame, guards, utils as dynamo_utils
from torch._dynamo import package as pk

phase, device = sys.argv[1], sys.argv[2]
from fxcc.client import dynamo_precompile
if phase == "former":  # torch's caching precompile builds the package's guards, then fxcc the whole ones
    dynamo_precompile._packaged_guards_class = lambda *args: None
from fxcc.client import backend, dynamo_cache, dynamo_identity
from fxcc.client.backend import fxcc_backend  # noqa: F401 - turns the package cache on

def plus_one(x):
    return x + 1

def plus_two(x):
    return x + 2

def plus_three(x):
    return x + 3

ACT = plus_one  # a global function: Dynamo guards it by identity

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)
        self.scale = 2.0

    def forward(self, x):
        return torch.sin(ACT(self.lin(x))) * self.scale

builds = []  # torch's guard builds per frame that convert_frame compiles
build_guards = guards.CheckFunctionManager.build_guards
def counted(*args, **kwargs):
    if builds:
        builds[-1] += 1
    return build_guards(*args, **kwargs)
guards.CheckFunctionManager.build_guards = counted
hooked = convert_frame.CheckFunctionManager
states = []
def recorded(*args, **kwargs):
    builds.append(0)
    manager = hooked(*args, **kwargs)
    if kwargs.get("save_guards"):
        states.append(manager.guards_state)
    return manager
convert_frame.CheckFunctionManager = recorded

def call(fn, *args):
    frames, graphs = dynamo_utils.counters["frames"]["ok"], len(backend.events())
    with torch.no_grad():
        out = fn(*args)
        torch.testing.assert_close(out, net(*args))
    return {"traced": dynamo_utils.counters["frames"]["ok"] - frames, "graphs": len(backend.events()) - graphs}

def summary(state):
    identities, rest = dynamo_identity.split(state)
    output_graph = pk.load_guards_state(rest).output_graph
    named = lambda name: name.split("[")[1].split("]")[0]
    return {"identities": sorted(name for name, _ in identities),
            "described": sorted(json.dumps(d) for _, d in identities),
            # a module global Dynamo names by its id (G['_1404..._c0']) differs between processes
            "guards": sorted(("G[id]" if name.startswith("G['_") and "_c0']" in name else name, kind)
                             for name, kind in ((g.name, g.create_fn_name()) for g in output_graph._guards)),
            "locals": sorted(output_graph.local_scope)}

torch.manual_seed(0)
net = Net().eval().to(device)
x, x6 = torch.randn(4, 16, device=device), torch.randn(6, 16, device=device)
out = {}
if phase == "failing_install":  # torch cannot rebuild the package's guards: its install fails
    def failing(*args, **kwargs):
        if not builds:  # the package's install (in torch.compile), before any frame compiles
            raise RuntimeError("a guard that cannot be rebuilt")
        return counted(*args, **kwargs)
    guards.CheckFunctionManager.build_guards = failing
compiled = torch.compile(net, backend="fxcc")  # a saved package is loaded and installed here
if phase in ("record", "former"):
    out["first"] = call(compiled, x)
    out["builds"] = list(builds)
    out["packaged"] = [summary(s) for s in states]
    out["counters"] = dynamo_cache.counters()
    ACT = plus_two  # this process kept Dynamo's own identity guard: it traces again
    out["rebound"] = call(compiled, x)
    ACT = plus_one
elif phase == "failing_install":
    out["traced"] = call(compiled, x)
    out["counters"] = dynamo_cache.counters()
else:  # load
    out["hit"] = call(compiled, x)
    out["shape"] = call(compiled, x6)
    ACT = plus_two  # the package's second entry (traced by the first process for plus_two)
    out["second_entry"] = call(compiled, x)
    ACT = plus_three  # the package's identity guards, carried in fxcc's form
    out["rebound"] = call(compiled, x)
    ACT = plus_one
    net.scale = 3.0
    out["attribute"] = call(compiled, x)
    out["counters"] = dynamo_cache.counters()
print(json.dumps(out))
"""


def _child(phase: str, root: Path, device: str = "cpu") -> dict:
    """The child's output for `phase` (record, former, load, failing_install) on `device` (a CPU's
    kernels in Triton's interpreter)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(FXCC_CACHE_DIR=str(root / ("former" if phase == "former" else "record") / "cache"),
               FXCC_PACKAGE_KEY_FILE=str(root / "package.key"), FXCC_DYNAMO_CACHE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)])))
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    p = subprocess.run([sys.executable, "-c", CHILD, phase, device], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_packaged_frame_builds_its_guards_once_and_saves_what_caching_precompile_saves(tmp_path):
    check_built_once(tmp_path, "cpu")


def check_built_once(tmp_path: Path, device: str) -> None:
    now, former = _child("record", tmp_path, device), _child("former", tmp_path, device)
    assert now["first"] == former["first"] == {"traced": 1, "graphs": 1}
    assert now["counters"] == former["counters"] == {"misses": 1, "saved": 1}
    assert now["builds"] == [1]  # torch's caching precompile built them twice, and fxcc once more
    assert former["builds"] == [3]
    # the package holds the same guards and identity guards as torch's own filtering gave
    assert len(now["packaged"]) == len(former["packaged"]) == 1
    assert now["packaged"] == former["packaged"]
    packaged = now["packaged"][0]
    assert "G['ACT']" in packaged["identities"]
    assert not any(kind in ("ID_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE", "DICT_VERSION")
                   for _, kind in packaged["guards"])
    assert any(kind == "TENSOR_MATCH" for _, kind in packaged["guards"])
    # the tracing process keeps the whole guards: a reassigned global function traces again
    assert now["rebound"]["traced"] == 1


def test_a_package_whose_guards_were_built_once_runs_and_guards_in_a_new_process(tmp_path):
    check_loaded(tmp_path, "cpu")


def check_loaded(tmp_path: Path, device: str) -> None:
    _child("record", tmp_path, device)
    out = _child("load", tmp_path, device)
    assert out["hit"] == out["second_entry"] == {"traced": 0, "graphs": 0}
    for case in ("shape", "rebound", "attribute"):
        assert out[case]["traced"] == 1 and out[case]["graphs"] >= 1, case
    assert out["counters"]["hits"] == 1


def test_a_package_that_does_not_install_traces_as_usual(tmp_path):
    # torch's install puts the builtins dict into the module's globals itself (uninstall leaves it):
    # the trace after a failed install picked the same name and asserted, out of the user's call
    _child("record", tmp_path)
    out = _child("failing_install", tmp_path)
    assert out["traced"] == {"traced": 1, "graphs": 1}
    assert out["counters"]["errors"] >= 1 and "hits" not in out["counters"]
