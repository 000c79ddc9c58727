"""Cache keys: sha256 over canonical forms, identical for the same graph from any process or rank."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from fxcc import compiler_core
from fxcc.compiler_core.wire import CompileRequest, GraphSpec


def canonical_graph(graph: GraphSpec) -> dict[str, Any]:
    """The graph with names replaced by their position (p0.., n0..), as plain JSON data.

    Node names are whatever the tracer chose (`add_1`, `mul_3`); two processes may pick
    different ones for the same computation, so they never enter a key.
    """
    rename = {p.name: f"p{i}" for i, p in enumerate(graph.placeholders)}
    rename.update({n.name: f"n{i}" for i, n in enumerate(graph.nodes)})

    def arg(a: Any) -> Any:
        d = a.model_dump()
        return _renamed(d, rename)

    def node(n: Any) -> dict[str, Any]:
        d = {"target": n.target, "args": [arg(a) for a in n.args],
             "kwargs": {k: arg(v) for k, v in sorted(n.kwargs.items())}}
        if n.opaque is not None:  # its schema and output specs (absent otherwise: older keys stay)
            d["opaque"] = n.opaque.model_dump()
        if n.triton is not None:  # the kernel's identity, grid and output specs
            d["triton"] = n.triton.model_dump()
        if n.control is not None:  # its subgraphs, canonical too (their hints are not in the key)
            d["control"] = {**n.control.model_dump(exclude={"graphs", "hints"}),
                            "graphs": [canonical_graph(g) for g in n.control.graphs]}
        if n.flex is not None:  # its mods are what the template inlines: two masks, two artifacts
            d["flex"] = {**n.flex.model_dump(exclude={"score_mod", "mask_mod", "joint"}),
                         **{name: canonical_graph(g) for name, g in (("score_mod", n.flex.score_mod),
                                                                     ("mask_mod", n.flex.mask_mod),
                                                                     ("joint", n.flex.joint)) if g is not None}}
        return d

    out = {
        "symbols": [s.model_dump() for s in graph.symbols],
        "placeholders": [p.model_dump(exclude={"name"}) for p in graph.placeholders],
        "nodes": [node(n) for n in graph.nodes],
        "outputs": [arg(a) for a in graph.outputs],
    }
    if graph.free_layout_outputs:  # absent otherwise: older keys stay
        out["free_layout_outputs"] = sorted(graph.free_layout_outputs)
    return out


def _renamed(d: Any, rename: dict[str, str]) -> Any:
    if isinstance(d, dict):
        if d.get("kind") == "node":
            return {"kind": "node", "name": rename[d["name"]]}
        return {k: _renamed(v, rename) for k, v in d.items()}
    if isinstance(d, list):
        return [_renamed(v, rename) for v in d]
    return d


def compile_key(request: CompileRequest) -> str:
    """The key of the artifact that compiling `request` produces.

    Covers the canonical graph, input specs, compile options (mode, target, runtime torch and
    triton major.minor) and the compiler_core version. Not the priority, nor anything of the
    calling process (device index, data pointers, object ids), nor the size symbols' hints —
    except for a variant, which exists for the sizes its hints name (its guards differ from the
    first artifact's, and neither overwrites the other).
    """
    payload = {
        "schema": request.schema_version,
        "graph": canonical_graph(request.graph),
        "options": request.options.model_dump(),
        "compiler_core": compiler_fingerprint(),
    }
    if request.variant:
        payload["variant_hints"] = dict(sorted(request.hints.items()))
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


@functools.cache
def compiler_fingerprint() -> str:
    """The compiler_core version plus a hash of its sources.

    Note: a version string alone would let a changed compiler serve artifacts an older one made
    under the same key (Inductor keys on its own source hash for the same reason).
    """
    root = Path(compiler_core.__file__).parent
    h = hashlib.sha256(compiler_core.__version__.encode())
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return f"{compiler_core.__version__}+{h.hexdigest()[:16]}"
