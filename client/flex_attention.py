"""flex_attention at run time, where the plan runs it eagerly: its mods rebuilt from their graphs.

Note: the plan carries score_mod, mask_mod and the backward's joint graph as graphs of aten ops
(wire.FlexAttention), never code; each becomes a small function that calls those ops in order
(resolved by compiler_core.wire.resolve_target, the allow-list every extern step goes through),
which torch's own flex_attention then runs under vmap as it runs the user's mods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fxcc.compiler_core.artifact import ExternStep
from fxcc.compiler_core.graph import decode_arg
from fxcc.compiler_core.wire import GraphSpec, resolve_target


def mod_function(spec: GraphSpec, many: bool = False) -> Callable[..., Any]:
    """A function of the graph's inputs that calls its aten ops and returns its output (`many`:
    the list of its outputs, as a joint graph returns them)."""
    calls = [(n.name, resolve_target(n.target, node=n.name), n.args, n.kwargs) for n in spec.nodes]
    names = [p.name for p in spec.placeholders]
    outputs = spec.outputs

    def call(*values: Any) -> Any:
        env: dict[str, Any] = dict(zip(names, values))
        for name, fn, args, kwargs in calls:
            env[name] = fn(*[decode_arg(a, env) for a in args], **{k: decode_arg(v, env) for k, v in kwargs.items()})
        outs = [decode_arg(o, env) for o in outputs]
        return outs if many else outs[0]
    return call


def flex_step(step: ExternStep, syms_key: str) -> Callable[[dict[str, Any]], None]:
    """The plan step of a flex_attention (or backward) node run by torch's own implementation."""
    flex = step.flex
    score_mod = mod_function(flex.score_mod)
    mask_mod = mod_function(flex.mask_mod)
    joint = mod_function(flex.joint, many=True) if flex.joint is not None else None
    options = dict(flex.kernel_options)
    out, args = step.out, step.args
    hop = torch.ops.higher_order.flex_attention_backward if joint else torch.ops.higher_order.flex_attention

    def run(env: dict[str, Any]) -> None:
        values = [decode_arg(a, env, env.get(syms_key)) for a in args]
        *tensors, block, scale, score_bufs, mask_bufs = values
        mods = (score_mod, joint) if joint else (score_mod,)
        env[out] = tuple(hop(*tensors, *mods, (*block, mask_mod), scale, dict(options), tuple(score_bufs),
                             tuple(mask_bufs)))
    return run
