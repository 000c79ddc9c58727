"""OpInfo sweep: every sample of torch's own op database, compiled by fxcc, compared with eager.

Each sample is traced to core aten (the decompositions the backend uses), captured as a GraphSpec,
compiled in-process and run by the client runtime (Triton kernels through TRITON_INTERPRET=1 on
CPU), then compared with eager using torch.testing.assert_close's default tolerances.

    TRITON_INTERPRET=1 .venv/bin/python tests/opinfo/sweep.py --all --out tests/opinfo/SUMMARY.md
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

os.environ.setdefault("TRITON_INTERPRET", "1")

# Ops whose results are random or uninitialised: no eager result to compare against.
NONDETERMINISTIC = {
    "cauchy", "exponential", "geometric", "log_normal", "normal", "uniform", "randn", "randn_like",
    "rand_like", "randint", "randint_like", "bernoulli", "multinomial", "rrelu", "nn.functional.rrelu",
    "empty", "empty_like",
    "new_empty", "new_empty_strided", "empty_strided", "empty_permuted", "nn.functional.dropout",
    "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "svd_lowrank", "pca_lowrank", "item", "hash_tensor",
    "resize_", "resize_as_",
    # Their samples use dropout_p > 0: eager and compiled draw different random masks.
    "nn.functional.scaled_dot_product_attention", "nn.functional.multi_head_attention_forward",
}

# The CI subset: every op family the compiler lowers, a few samples each.
CI_OPS = [
    "add", "sub", "mul", "div", "true_divide", "abs", "neg", "exp", "exp2", "expm1", "log", "log1p",
    "log2", "sin", "cos", "tan", "tanh", "sigmoid", "erf", "rsqrt", "sqrt", "reciprocal", "pow",
    "clamp", "clamp_min", "where", "maximum", "minimum", "eq", "ne", "lt", "ge", "logical_and",
    "logical_not", "bitwise_and", "sign", "floor", "ceil", "trunc", "round", "remainder", "fmod", "lerp",
    "isnan", "isinf", "nan_to_num", "nn.functional.gelu", "nn.functional.relu", "nn.functional.silu",
    "nn.functional.hardtanh", "nn.functional.leaky_relu", "softmax", "log_softmax", "sum", "mean",
    "amax", "amin", "prod", "var", "std", "argmax", "any", "all", "logsumexp",
    "native_layer_norm", "nn.functional.layer_norm", "nn.functional.rms_norm", "cat", "stack",
    "gather", "index_select", "nn.functional.embedding", "constant_pad_nd", "clone", "transpose",
    "permute", "expand", "squeeze", "unsqueeze", "reshape", "narrow", "select", "flatten", "to",
    "full_like", "zeros_like", "masked_fill", "addcmul", "hypot", "atan2", "square", "mm", "bmm",
]


@dataclass
class SampleResult:
    op: str
    dtype: str
    status: str  # native | partly-extern | all-extern | failed | unsupported | untraceable
    detail: str = ""


def compile_and_run(fn, tensors: list[torch.Tensor]):
    """fxcc's result of `fn(*tensors)`, plus the artifact's (lowered, extern) node counts."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.compile import compile_request
    from fxcc.compiler_core.wire import CompileRequest

    def flat_fn(*xs):
        return pytree.tree_leaves(fn(*xs))

    gm = make_fx(flat_fn, decomposition_table=decomposition_table())(*tensors)
    cap = capture_graph(gm, tensors)
    art = compile_request(CompileRequest(graph=cap.spec))
    out = load_plan(art)(list(tensors) + cap.constants)
    return list(out), art.manifest.stats


def _float64_reference(fn, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    up = [t.double() if t.is_floating_point() else t for t in tensors]
    return [o.double() if isinstance(o, torch.Tensor) else o for o in pytree.tree_leaves(fn(*up))]


def run_sample(opinfo, sample) -> tuple[str, str]:
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i] for i in positions]

    def fn(*xs):
        filled = list(leaves)
        for i, x in zip(positions, xs):
            filled[i] = x
        inp, args, kwargs = pytree.tree_unflatten(filled, spec)
        return opinfo.op(inp, *args, **kwargs)

    try:
        expected = pytree.tree_leaves(fn(*[t.clone() for t in tensors]))
    except Exception as e:  # noqa: BLE001 - eager itself rejects this sample: nothing to compare
        return "untraceable", f"eager: {type(e).__name__}"
    try:
        got, stats = compile_and_run(fn, [t.clone() for t in tensors])
    except Exception as e:  # noqa: BLE001
        name = type(e).__name__
        if name in ("UnsupportedOp",) or "make_fx" in traceback.format_exc(limit=3):
            return "untraceable", f"{name}: {str(e)[:120]}"
        if name == "InvalidGraph" and "DynamicOutputShape" in str(e):
            # Data-dependent output shapes (masked_select, nonzero): the worker cannot re-derive
            # them, so the client runs such a graph eagerly. Not a wrong result.
            return "unsupported", "data-dependent output shape"
        return "failed", f"{name}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    try:
        assert len(got) == len(expected), f"{len(got)} outputs, eager has {len(expected)}"
        reference = None
        for i, (g, e) in enumerate(zip(got, expected)):
            if not isinstance(e, torch.Tensor):
                assert g == e, f"{g!r} != {e!r}"
                continue
            assert g.shape == e.shape and g.dtype == e.dtype, f"{g.dtype}{list(g.shape)} vs {e.dtype}{list(e.shape)}"
            try:
                torch.testing.assert_close(g, e, equal_nan=True)
            except AssertionError:
                # Note: in bf16/fp16 fxcc computes in fp32; eager rounds where its kernels end.
                # Like Inductor's tests (reference_in_float), accept a result at least as close as
                # eager's to the same computation in float64, or close to that float64 result
                # rounded to the dtype with the dtype's default tolerances.
                if e.dtype not in (torch.bfloat16, torch.float16):
                    raise
                reference = reference or _float64_reference(fn, tensors)
                truth = reference[i]
                ours = (g.double() - truth).abs().nan_to_num(0).max()
                theirs = (e.double() - truth).abs().nan_to_num(0).max()
                if ours > theirs:  # else: closer to float64 than eager is
                    torch.testing.assert_close(g, truth.to(g.dtype), equal_nan=True,
                                               msg="further from float64 than eager, and not close to it")
    except AssertionError as err:
        return "failed", str(err).splitlines()[0][:160] if str(err) else "mismatch"
    if stats.nodes_extern == 0:
        return "native", ""
    if stats.nodes_lowered == 0:
        return "all-extern", ", ".join(stats.extern_ops)[:160]
    return "partly-extern", ", ".join(stats.extern_ops)[:160]


def sweep(op_names: list[str] | None, dtypes: list[torch.dtype], max_samples: int,
          verbose: bool = False) -> list[SampleResult]:
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = set(op_names) if op_names else None
    results: list[SampleResult] = []
    for opinfo in op_db:
        if opinfo.name in NONDETERMINISTIC or (wanted is not None and opinfo.name not in wanted):
            continue
        for dtype in dtypes:
            if dtype not in opinfo.supported_dtypes("cpu"):
                continue
            try:
                samples = list(opinfo.sample_inputs("cpu", dtype, requires_grad=False))[:max_samples]
            except Exception as e:  # noqa: BLE001
                results.append(SampleResult(opinfo.name, str(dtype), "untraceable", f"samples: {e}"))
                continue
            for sample in samples:
                status, detail = run_sample(opinfo, sample)
                results.append(SampleResult(opinfo.name, str(dtype).removeprefix("torch."), status, detail))
                if verbose and status == "failed":
                    print(f"FAILED {opinfo.name} {dtype}: {detail}", file=sys.stderr)
    return results


def summarize(results: list[SampleResult]) -> dict[tuple[str, str], str]:
    """Per (op, dtype): failed if any sample failed, else native / partly-extern / all-extern."""
    order = ["failed", "partly-extern", "all-extern", "native", "unsupported", "untraceable"]
    per: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for r in results:
        per[(r.op, r.dtype)].append(r.status)
    out = {}
    for k, statuses in per.items():
        real = [s for s in statuses if s not in ("untraceable", "unsupported")] or \
            [min(statuses, key=order.index)]
        if "native" in real and any(s in ("partly-extern", "all-extern") for s in real):
            out[k] = "partly-extern"
        else:
            out[k] = min(real, key=order.index)
    return out


def render(results: list[SampleResult], seconds: float) -> str:
    per = summarize(results)
    counts = collections.Counter(per.values())
    lines = ["# OpInfo sweep", "",
             f"{len(per)} (op, dtype) pairs, {len(results)} samples, {seconds:.0f} s. "
             + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())), "",
             "| op | dtype | result | detail |", "|---|---|---|---|"]
    details = {(r.op, r.dtype): r.detail for r in results if r.detail}
    for (op, dtype), status in sorted(per.items()):
        lines.append(f"| {op} | {dtype} | {status} | {details.get((op, dtype), '')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--all", action="store_true", help="every op in op_db (else the CI subset)")
    p.add_argument("--ops", nargs="*", help="these ops only")
    p.add_argument("--max-samples", type=int, default=8)
    p.add_argument("--out", help="write the markdown summary here")
    a = p.parse_args()
    ops = a.ops or (None if a.all else CI_OPS)
    t0 = time.perf_counter()
    results = sweep(ops, [torch.float32, torch.bfloat16], a.max_samples, verbose=True)
    text = render(results, time.perf_counter() - t0)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text.split("\n\n")[1])
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
