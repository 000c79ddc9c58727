"""Test helpers: trace a function to aten, compile it with fxcc, run the plan, compare with eager."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.graph import rebuild_graph, wire_graph
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest, GraphSpec


@functools.cache
def _core_aten_table() -> dict[Any, Callable[..., Any]]:
    """torch's core-aten decompositions, built once per process (~70 ms each time otherwise: torch
    walks every op namespace); the tests register no op that would change them."""
    return dict(core_aten_decompositions().items())


def compile_fn(fn: Callable[..., Any], *inputs: torch.Tensor, decompose: bool = True) -> Artifact:
    """Trace `fn` to an aten graph (core-aten decompositions) and compile it."""
    table = dict(_core_aten_table()) if decompose else {}
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=table)(*inputs)
    cap = capture_graph(gm, list(inputs))
    assert not cap.constants
    return compile_request(CompileRequest(graph=cap.spec))


def run_pass(rewrite: Callable[..., bool], spec: GraphSpec, *args: Any,
             hints: dict[str, int] | None = None) -> tuple[torch.fx.GraphModule, GraphSpec]:
    """`rewrite` (a graph pass) on the rebuild of `spec`, in place: the graph and its wire form
    (`spec` itself where the pass did not fire)."""
    gm = rebuild_graph(spec, hints)
    fired = rewrite(gm, *args)
    new = wire_graph(gm, spec)
    assert fired == (new is not spec)
    return gm, new


def run(artifact: Artifact, *inputs: torch.Tensor) -> tuple[Any, ...]:
    return load_plan(artifact)(list(inputs))


def check(fn: Callable[..., Any], *inputs: torch.Tensor, atol: float | None = None,
          rtol: float | None = None, decompose: bool = True) -> Artifact:
    """Compile `fn`, run it, and assert that every output matches eager (values, shape, strides, dtype)."""
    art = compile_fn(fn, *inputs, decompose=decompose)
    got = run(art, *inputs)
    with torch.no_grad():
        want = fn(*inputs)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True)
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.numel() > 1 and not any(s == 0 for s in w.stride()):
            # Strides of size-1 dims carry no meaning (and FakeTensor's can differ from eager's).
            assert [st for st, n in zip(g.stride(), g.shape) if n > 1] == \
                [st for st, n in zip(w.stride(), w.shape) if n > 1], (g.stride(), w.stride())
    return art


def kernel_steps(art: Artifact) -> list[Any]:
    return [s for s in art.manifest.plan.steps if s.kind == "kernel"]


def alloc_steps(art: Artifact) -> list[Any]:
    return [s for s in art.manifest.plan.steps if s.kind == "alloc"]


_BUILD_SM90 = """
import json, sys
from fxcc.compiler_core.build import build_artifact
from fxcc.compiler_core.graph import rebuild_graph, wire_graph
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest, GraphSpec
request = CompileRequest.model_validate_json(open(sys.argv[1]).read())
built = build_artifact(compile_request(request), request, 90)
print(json.dumps([[k.name, k.metadata.get("sm_90.error"), "sm_90" in k.binaries] for k in built.manifest.kernels]))
"""


def build_for_sm90(request: CompileRequest, tmp_path: Path) -> list[tuple[str, str | None, bool]]:
    """(kernel, build error, whether it has an sm_90 cubin) for each kernel of `request` compiled and
    built in a fresh process without TRITON_INTERPRET, as a CPU worker builds."""
    path = tmp_path / "request.json"
    path.write_text(request.model_dump_json())
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                      env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _BUILD_SM90, str(path)], env=env, capture_output=True, check=False,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return [tuple(k) for k in json.loads(done.stdout.strip().splitlines()[-1])]
