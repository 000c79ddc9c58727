"""torch.cond and while_loop at run time: the step picks a branch's plan, or loops its body's plan.

Note: each subgraph is a plan of its own (compiler_core.control_flow) run over the step's operands
by a runner of the same artifact, so its kernels and guards are its own. The predicate is read on
the host, as eager's cond and while_loop read it. The node's results are checked against the specs
the client's trace gave them (client/opaque_ops.result_check), so a branch whose outputs differ
from what the outer plan's kernels assume fails the run (that graph then runs eagerly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fxcc.client.opaque_ops import result_check
from fxcc.compiler_core.artifact import ExternStep, Plan
from fxcc.compiler_core.graph import decode_arg


def control_step(step: ExternStep, runner: Callable[[Plan], Callable[[list[Any]], tuple[Any, ...]]],
                 syms_key: str) -> Callable[[dict[str, Any]], None]:
    """The plan step of a control flow node; `runner` makes a callable of a subplan, `syms_key` is
    where a plan's environment holds the call's size symbols."""
    flow = step.control
    first, second = (runner(p) for p in flow.plans)
    check = result_check(step.op, flow.outputs, "its trace")
    out, args = step.out, step.args

    def operands(env: dict[str, Any]) -> list[Any]:
        return [decode_arg(a, env, env.get(syms_key)) for a in args]

    if flow.kind == "cond":
        def run_cond(env: dict[str, Any]) -> None:
            pred, *rest = operands(env)
            value = (first if bool(pred) else second)(rest)
            check(list(value), env.get(syms_key))
            env[out] = value
        return run_cond

    carried = flow.carried

    def run_while(env: dict[str, Any]) -> None:
        values = operands(env)
        state, extra = values[:carried], values[carried:]
        while bool(first(state + extra)[0]):
            state = list(second(state + extra))
        value = tuple(state)
        check(list(value), env.get(syms_key))
        env[out] = value
    return run_while
