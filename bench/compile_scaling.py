"""Compile time against graph width: n nodes that each read the input, every one a graph output.

`TRITON_INTERPRET=1 python -m bench.compile_scaling [--n 250 500 1000 2000 4000] [--op sin|add|mul]
[--profile N]`. For each n it builds the fan graph (n nodes `aten.<op>(x)`, all outputs) as a
GraphSpec and times, in this process, what a worker does before any binary is built: the
pipeline's rebuild stage (FakeTensor shape propagation, which the service's request check also
runs) and the rest of its front stages (passes, lowering, scheduling, Triton codegen, the plan).
No cubin is built and no kernel runs. Prints one JSON line per n: seconds for each part, and the total divided by n
(flat when compile time grows linearly). `--profile N` prints cProfile's top entries for n=N instead.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

from fxcc.compiler_core import pipeline
from fxcc.compiler_core.wire import (
    CompileOptions,
    CompileRequest,
    FloatArg,
    GraphSpec,
    Node,
    NodeRef,
    Placeholder,
    Target,
    TensorSpec,
)

OPS = {
    "sin": ("aten.sin.default", []),
    "add": ("aten.add.Tensor", [FloatArg(value=1.5)]),
    "mul": ("aten.mul.Tensor", [FloatArg(value=2.0)]),
}


def fan_graph(n: int, op: str = "sin", sizes: tuple[int, int] = (8, 16)) -> GraphSpec:
    """n nodes `op(x)` of one (8, 16) float32 input, every node an output."""
    target, extra = OPS[op]
    x = Placeholder(name="x", spec=TensorSpec(dtype="float32", sizes=list(sizes), strides=[sizes[1], 1]))
    nodes = [Node(name=f"y{i}", target=target, args=[NodeRef(name="x"), *extra]) for i in range(n)]
    return GraphSpec(placeholders=[x], nodes=nodes, outputs=[NodeRef(name=f"y{i}") for i in range(n)])


def measure(n: int, op: str) -> dict[str, float | int]:
    request = CompileRequest(graph=fan_graph(n, op), options=CompileOptions(target=Target(kind="interpret")))
    t0 = time.perf_counter()
    c = pipeline.run(pipeline.Compilation(request, record=False), ("rebuild",))
    t1 = time.perf_counter()
    pipeline.run(c, pipeline.FRONT[1:])
    t2 = time.perf_counter()
    plan, kernels = c.plan, c.artifact.manifest.kernels
    total = t2 - t0
    return {"n": n, "op": op, "rebuild_s": round(t1 - t0, 3), "compile_graph_s": round(t2 - t1, 3),
            "total_s": round(total, 3), "ms_per_node": round(1000 * total / n, 3),
            "kernels": len(kernels), "steps": len(plan.steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[250, 500, 1000, 2000, 4000])
    parser.add_argument("--op", choices=sorted(OPS), default="sin")
    parser.add_argument("--profile", type=int, default=0, help="profile one compile of this width")
    parser.add_argument("--sort", default="cumulative", help="cProfile sort key for --profile (tottime, ...)")
    args = parser.parse_args()
    measure(10, args.op)  # warm-up: imports, lowering registry, first FakeTensor dispatch
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(measure, args.profile, args.op)
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(40)
        return
    for n in args.n:
        print(json.dumps(measure(n, args.op)), flush=True)


if __name__ == "__main__":
    main()
