"""Triton source for a scheduled kernel: an ops handler that emits text, and the kernel templates around it.

Note: source text is a pure function of the kernel (names by position, kernel name from a hash of
the body), so the same graph always yields byte-identical source and the same blob digest.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from fxcc.compiler_core.errors import CodegenError
from fxcc.compiler_core.ir.nodes import ComputedBuffer, Reduction
from fxcc.compiler_core.ir.ops import WELFORD, OpsHandler, compute_dtype, result_dtype, use_handler
from fxcc.compiler_core.scheduler import (
    Coords,
    Kernel,
    kernel_index,
    loopable,
    node_coords,
    run_body,
    store_index,
)
from fxcc.compiler_core.sizevars import RINDEX, XINDEX, Expr, FloorDiv, render_index
from fxcc.compiler_core.symbolic import hint, is_symbolic, size_symbols_of
from fxcc.compiler_core.target import capabilities

TL_DTYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int8: "tl.int8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

# Unary math spelled per target. The interpreter has no libdevice, so it gets tl.* forms.
CUDA_UNARY = {
    name: f"libdevice.{name}({{}})" for name in (
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
        "exp", "exp2", "expm1",
        "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "erf", "floor", "ceil", "trunc")
} | {"round": "libdevice.nearbyint({})", "sigmoid": "tl.sigmoid({})"}
INTERPRET_UNARY = {
    "sin": "tl.sin({})", "cos": "tl.cos({})", "exp": "tl.exp({})", "exp2": "tl.exp2({})",
    "log": "tl.log({})", "log2": "tl.log2({})", "sqrt": "tl.sqrt({})", "rsqrt": "tl.rsqrt({})",
    "erf": "tl.erf({})", "floor": "tl.floor({})", "ceil": "tl.ceil({})", "sigmoid": "tl.sigmoid({})",
    "tanh": "(1.0 - 2.0 / (tl.exp(2.0 * {0}) + 1.0))",
    "trunc": "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
    # Note: log(1 + x) loses x's low bits when |x| is small. Goldberg's correction scales log(u)
    # by x / (u - 1), the exact ratio of x to the rounded u - 1, which keeps a few-ulp error; u == x
    # (|x| >= 2**24, or inf) needs no correction.
    "log1p": "tl.where(1.0 + {0} == 1.0, {0}, tl.where(1.0 + {0} == {0}, tl.log(1.0 + {0}), "
             "tl.log(1.0 + {0}) * ({0} / ((1.0 + {0}) - 1.0))))",
    # Note: Kahan's expm1: (u - 1) * x / log(u) with u = exp(x) cancels exp's rounding error.
    "expm1": "tl.where(tl.exp({0}) == 1.0, {0}, tl.where(tl.exp({0}) - 1.0 == -1.0, -1.0, "
             "tl.where(tl.exp({0}) == float(\"inf\"), tl.exp({0}), "
             "(tl.exp({0}) - 1.0) * ({0} / tl.log(tl.exp({0}))))))",
}
COMMON_UNARY = {
    "normal_cdf": "_fxcc_normal_cdf({})",
    "abs": "tl.abs({})", "neg": "-{}", "bitwise_not": "~{}", "logical_not": "({} == 0)",
    "reciprocal": "(1.0 / {})", "isnan": "({0} != {0})",
    "isinf": "(tl.abs({0}) == float(\"inf\"))",
    "isfinite": "(({0} == {0}) & (tl.abs({0}) != float(\"inf\")))",
}
BINARY = {
    "add": "({} + {})", "sub": "({} - {})", "mul": "({} * {})", "truediv": "({} / {})",
    "eq": "({} == {})", "ne": "({} != {})", "lt": "({} < {})", "le": "({} <= {})",
    "gt": "({} > {})", "ge": "({} >= {})", "logical_and": "({} & {})", "logical_or": "({} | {})",
    "logical_xor": "({} ^ {})", "bitwise_and": "({} & {})", "bitwise_or": "({} | {})",
    "bitwise_xor": "({} ^ {})",
    # NaN-propagating, as torch.maximum/minimum are.
    "maximum": "tl.where(({0} > {1}) | ({0} != {0}), {0}, {1})",
    "minimum": "tl.where(({0} < {1}) | ({0} != {0}), {0}, {1})",
}
CUDA_BINARY = {"pow": "libdevice.pow({}, {})"}
# Floating-point `%` is C's fmod (frem) on GPUs and np.fmod in the interpreter: exact on both.
# Note: lowerings emit integer fmod only by a non-zero constant: `%` by zero has no eager-like behaviour.
FLOAT_BINARY = {"fmod": "({} % {})"}


def unary_table(target: str) -> dict[str, str]:
    return COMMON_UNARY | (CUDA_UNARY if target == "cuda" else INTERPRET_UNARY)


def binary_table(target: str) -> dict[str, str]:
    return BINARY | FLOAT_BINARY | (CUDA_BINARY if target == "cuda" else {})


def _check_capabilities() -> None:
    """The tables spell exactly what compiler_core.target says each target spells (lowerings ask it)."""
    for target in ("cuda", "interpret"):
        caps = capabilities(target)
        if set(unary_table(target)) != caps.unary or set(binary_table(target)) != caps.binary:
            raise CodegenError(f"codegen's {target} spellings differ from compiler_core.target's capabilities: "
                               f"{sorted(set(unary_table(target)) ^ caps.unary)} "
                               f"{sorted(set(binary_table(target)) ^ caps.binary)}")


_check_capabilities()


REDUCE_IDENTITY = {"sum": 0, "prod": 1, "max": "-inf", "min": "inf"}
COMBINE = {
    "sum": "({0} + {1})", "prod": "({0} * {1})",
    "max": "tl.where(({0} > {1}) | ({0} != {0}), {0}, {1})",
    "min": "tl.where(({0} < {1}) | ({0} != {0}), {0}, {1})",
}
HELPERS = """
@triton.jit
def _fxcc_sum(a, b):
    return a + b


@triton.jit
def _fxcc_prod(a, b):
    return a * b


@triton.jit
def _fxcc_max(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _fxcc_min(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _fxcc_normal_cdf(x):
    # Phi(x) for fp32 x, from erfc(|x| / sqrt 2) with Numerical Recipes' erfcc (relative error
    # < 1.2e-7 everywhere): 1 - erfc / 2 above 0, erfc / 2 below, so the lower tail keeps its
    # relative accuracy (1 + erf(x) in fp32 cancels to 0 there). A third of libdevice erf's work.
    z = tl.abs(x) * 0.7071067811865476
    t = tl.fdiv(1.0, 1.0 + 0.5 * z, ieee_rounding=False)
    p = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    q = 0.5 * t * tl.exp(p - z * z)
    return tl.where(x >= 0, 1.0 - q, q)


@triton.jit
def _fxcc_round_bf16(x):
    # fp32 rounded to the nearest bf16 (ties to even), so that a truncating conversion is exact.
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
"""


@dataclass(frozen=True)
class TVal:
    """A Triton value in generated code: its variable (or expression) and dtype."""

    text: str
    dtype: torch.dtype


def cast(text: str, dtype: torch.dtype, target: str = "cuda", source: torch.dtype | None = None) -> str:
    """`text` converted to `dtype`. Float downcasts round to nearest even on GPUs; Triton's CPU
    interpreter truncates fp32 → bf16, so there the value is rounded first (as torch rounds)."""
    if target == "interpret" and dtype == torch.bfloat16 and source == torch.float32:
        return f"_fxcc_round_bf16({text}).to(tl.bfloat16)"
    return f"{text}.to({TL_DTYPES[dtype]})"


def literal(value: bool | float, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        v = float(value)
        return repr(v) if math.isfinite(v) else f'float("{v}")'
    return str(int(value))


@dataclass
class TritonHandler(OpsHandler):
    """Emits one line per distinct op into `lines` (common subexpressions reuse a variable)."""

    target: str
    kernel: Kernel
    args: dict[str, str]
    buffer_dtypes: dict[str, torch.dtype]
    registers: dict[str, TVal] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    cse: dict[str, TVal] = field(default_factory=dict)
    counter: int = 0
    size_symbols: set[sympy.Symbol] = field(default_factory=set)  # become kernel parameters
    # a Welford body (its inner_fn) -> its (mean, m2, weight), so the nodes of one accumulate once
    welford: dict[int, tuple[TVal, TVal, TVal]] = field(default_factory=dict)
    prefix: str = "tmp"  # of the temporaries' names

    def index(self, expr: Expr) -> Expr:
        """`expr` in kernel coordinates; its size symbols become kernel parameters."""
        index = kernel_index(expr, self.kernel)
        self.size_symbols |= size_symbols_of(index)
        return index
    # indirect index symbol → the variable saying where it is in range; masks of enclosing ops.masked
    indirect_masks: dict[sympy.Symbol, str] = field(default_factory=dict)
    mask_stack: list[str] = field(default_factory=list)

    def emit(self, text: str, dtype: torch.dtype) -> TVal:
        key = f"{text}:{dtype}"
        hit = self.cse.get(key)
        if hit is not None:
            return hit
        var = TVal(f"{self.prefix}{self.counter}", dtype)
        self.counter += 1
        self.lines.append(f"{var.text} = {text}")
        self.cse[key] = var
        return var

    def mask_for(self, expr: Expr) -> str | None:
        parts = []
        if expr.has(XINDEX):
            parts.append("xmask")
        if expr.has(RINDEX):
            parts.append("rmask")
        parts += [self.indirect_masks[s] for s in sorted(expr.free_symbols, key=str) if s in self.indirect_masks]
        parts += self.mask_stack
        return " & ".join(parts) or None

    def load(self, name: str, index: Expr) -> TVal:
        if name in self.registers:
            return self.registers[name]
        index = self.index(index)
        mask = self.mask_for(index)
        buf_dtype = self.buffer_dtypes[name]
        where = render_index(index)
        if mask is None or not (index.has(XINDEX) or index.has(RINDEX)):
            # Note: an address that depends on no index (a 0-d input, a broadcast scalar) still loads
            # a block: a scalar load mixes badly with blocks in Triton's interpreter (logical and
            # where on scalars), and the hardware serves the repeated address from cache.
            where, mask = f"{where} + 0 * xindex", f"xmask & {mask}" if mask else "xmask"
        text = f"tl.load({self.args[name]} + ({where}), {mask})"
        comp = compute_dtype(buf_dtype)
        if comp != buf_dtype:
            text += f".to({TL_DTYPES[comp]})"
        return self.emit(text, comp)

    def constant(self, value: bool | float, dtype: torch.dtype) -> TVal:
        return self.emit(f"tl.full([1], {literal(value, dtype)}, {TL_DTYPES[dtype]})", dtype)

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> TVal:
        index = self.index(expr)
        if index.is_Integer:  # a Python int has no .to(): a one-element arange, say
            return self.emit(f"tl.full([1], {int(index)}, {TL_DTYPES[dtype]})", dtype)
        return self.emit(f"({render_index(index)}).to({TL_DTYPES[dtype]})", dtype)

    def to_dtype(self, x: TVal, dtype: torch.dtype) -> TVal:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self.emit(f"({x.text} != 0)", dtype)
        if dtype == torch.bfloat16 and x.dtype != torch.float32:
            # Note: through fp32 (Triton's interpreter turns a bool or int straight into bf16 bits).
            x = self.emit(cast(x.text, torch.float32), torch.float32)
        elif x.dtype == torch.bfloat16 or not x.dtype.is_floating_point:
            return self.emit(cast(x.text, dtype), dtype)
        return self.emit(cast(x.text, dtype, self.target, x.dtype), dtype)

    def unary(self, op: str, x: TVal) -> TVal:
        template = unary_table(self.target).get(op)
        if template is None:
            raise CodegenError(f"no {self.target} spelling for {op}", op=op)
        return self.emit(template.format(x.text), result_dtype(op, x.dtype))

    def binary(self, op: str, a: TVal, b: TVal) -> TVal:
        template = binary_table(self.target).get(op)
        if template is None:
            raise CodegenError(f"no {self.target} spelling for {op}", op=op)
        return self.emit(template.format(a.text, b.text), result_dtype(op, a.dtype, b.dtype))

    def where(self, cond: TVal, a: TVal, b: TVal) -> TVal:
        return self.emit(f"tl.where({cond.text}, {a.text}, {b.text})", a.dtype)

    def indirect_indexing(self, x: TVal, size: Expr | int) -> sympy.Symbol:
        v = self.to_dtype(x, torch.int64)
        # Note: a symbolic size (an embedding table sliced to the sequence length) is a kernel parameter.
        bound = str(int(size)) if not is_symbolic(size) else f"({render_index(self.index(sympy.sympify(size)))})"
        wrapped = self.emit(f"tl.where({v.text} < 0, {v.text} + {bound}, {v.text})", torch.int64)
        valid = self.emit(f"(({wrapped.text} >= 0) & ({wrapped.text} < {bound}))", torch.bool)
        sym = sympy.Symbol(wrapped.text, integer=True, nonnegative=True)
        self.indirect_masks[sym] = valid.text
        return sym

    def masked(self, mask: TVal, body: Any, other: bool | float) -> TVal:
        self.mask_stack.append(mask.text)
        try:
            value = body()
        finally:
            self.mask_stack.pop()
        return self.where(mask, value, self.constant(other, value.dtype))


@dataclass(frozen=True)
class RenderedKernel:
    """Source text plus everything a KernelStep and KernelInfo need."""

    name: str
    source: str
    args: list[str]
    xnumel: Any  # int or a size expression
    rnumel: Any
    grid: list[Any]
    constexprs: dict[str, int]
    num_warps: int
    reduction: bool = False
    size_args: tuple[Any, ...] = ()  # size symbols passed after xnumel/rnumel
    num_stages: int = 1


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


SYMBOLIC_RBLOCK_MIN = 128
# The widest tiles any launch config takes (the autotuner's candidates included): a static size
# that is a multiple of these is covered by whole tiles under every config.
XBLOCK_MAX = 4096  # also keeps 4096 of int32 headroom for index arithmetic past xnumel
RBLOCK_MAX = 4096


def tiles_evenly(numel: Any, block_max: int) -> bool:
    """Whether every tile of every config covers `numel` exactly (a static multiple of `block_max`,
    tiles being powers of two no wider): its mask is then all true and emitted as a constant, which
    Triton folds away (no compare, no select, unpredicated loads and stores).

    Note: on the H200, bias+GELU+LayerNorm fp32 over 16384x1024 ran 38.05 us without masks against
    38.92 us with (best config of each; cuda-graph device time, tmp s6 run)."""
    return block_max > 0 and not is_symbolic(numel) and int(numel) % block_max == 0


def launch_config(kernel: Kernel) -> tuple[dict[str, int], int]:
    """(constexprs, num_warps) for a kernel; fixed heuristics until the autotuner picks them.

    Symbolic sizes choose by their hint (the example's value): any choice is correct, since
    masks cover every size and a symbolic row length always gets the looped reduction.

    Note: a symbolic row is looped because it may take any length, not because it is long: its
    tile is sized by the hint's row as a persistent one would be (at most 2048 wide), never a
    fixed 2048-wide one. Rows of a few dozen elements (attention scores over a dynamic sequence)
    under RBLOCK 2048 left over 98% of every tile masked, one row per program; and plans with
    symbolic sizes are never autotuned, so this config is the one that runs.
    """
    xnumel = hint(kernel.xnumel)
    if kernel.rnumel == 1:
        xblock = min(1024, max(16, next_pow2(xnumel)))
        return {"XBLOCK": xblock}, 4 if xblock >= 512 else 2
    if kernel.column:
        return column_tile(xnumel)
    if kernel.looped and not is_symbolic(kernel.rnumel):
        return {"XBLOCK": 1, "RBLOCK": 2048}, 8
    # a persistent row fits its whole length (at most PERSISTENT_RNUMEL_MAX); a symbolic one loops
    # over tiles at least SYMBOLIC_RBLOCK_MIN wide: on the H200, hint 9 with RBLOCK 16 ran rows of
    # 4096 5x slower than the fixed 1x2048 tile (coalescing), which ran rows of 9 20x slower
    rblock = (min(2048, max(SYMBOLIC_RBLOCK_MIN, next_pow2(hint(kernel.rnumel)))) if kernel.looped
              else next_pow2(kernel.rnumel))
    # Note: a tile holds about 8 KB of the rows' stored dtype: 2048 fp32 elements, 4096 bf16 ones.
    # On the H200, bias+GELU+LayerNorm over bf16 rows of 1024 ran 4 rows on 4 warps in 0.0370 ms
    # against 2 rows' 0.0384 (the autotuner's pick); fp32 tiles are as before.
    narrow = max(1, 4 // stored_itemsize(kernel))
    xblock = max(1, min(64, 2048 * narrow // rblock, next_pow2(xnumel)))
    elems = xblock * rblock // narrow  # in fp32-sized elements
    return {"XBLOCK": xblock, "RBLOCK": rblock}, 8 if elems >= 4096 else 4 if elems >= 1024 else 2


# A column reduction's tile: COLUMN_XBLOCK outputs wide (contiguous in memory: each row of the tile
# is one 256-byte fp32 read), COLUMN_RBLOCK reduced elements deep, as Inductor's outer-reduction
# tiles are; lowering.reduction splits rows so that enough such programs fill the device.
COLUMN_XBLOCK = 64
COLUMN_RBLOCK = 16


def column_tile(xnumel: int) -> tuple[dict[str, int], int]:
    """(constexprs, num_warps) of a column reduction over `xnumel` outputs: as wide as the outputs
    allow up to COLUMN_XBLOCK, the tile kept at 1024 elements (8 a thread on 4 warps).

    Note: the tile was 8 or 16 outputs by 128 reduced elements: 32 or 64 contiguous bytes a row,
    and a ResNet-18 layer2 batch-norm statistic (128 channels) ran as 16 programs on 132 SMs.
    """
    xblock = min(COLUMN_XBLOCK, max(8, next_pow2(xnumel)))
    return {"XBLOCK": xblock, "RBLOCK": COLUMN_RBLOCK * COLUMN_XBLOCK // xblock}, 4


def stored_itemsize(kernel: Kernel) -> int:
    """The widest element the kernel stores (4 when it stores nothing it computes in fp32 or wider)."""
    sizes = [n.buffer.dtype.itemsize for n in kernel.nodes if n.name in kernel.stored]
    return max(sizes) if sizes else 4


def launch_grid(xnumel: Any, xblock: int) -> list[Any]:
    """The launch grid of a kernel over `xnumel` rows: one program per XBLOCK of them (a size
    expression when xnumel is symbolic)."""
    if is_symbolic(xnumel):
        return [FloorDiv(xnumel + xblock - 1, xblock)]
    return [-(-xnumel // xblock)]


def render_kernel(kernel: Kernel, buffers: dict[str, Any], target: str,
                  looped: bool | None = None) -> RenderedKernel:
    """The Triton source of one kernel, with its argument order and launch configuration.

    `looped` overrides the scheduler's choice of a looped (RBLOCK at a time) or persistent (the
    whole row in registers) reduction; the autotuner renders both where both are valid.
    """
    looped = kernel.looped if looped is None else looped
    own = kernel.names()
    loads: list[str] = []
    for node in kernel.nodes:
        for name, _ in node.loads:
            if name not in own and name not in loads:
                loads.append(name)
    stores = [n.name for n in kernel.nodes if n.name in kernel.stored]
    args = {name: f"in_ptr{i}" for i, name in enumerate(loads)}
    args |= {name: f"out_ptr{i}" for i, name in enumerate(stores)}
    h = TritonHandler(target, kernel, args, {name: buffers[name].dtype for name in loads})
    reduction = kernel.rnumel != 1
    placed = [(node, node_coords(node, kernel.xnumel, kernel.rnumel, kernel.partition)) for node in kernel.nodes]
    for node, coords in placed:
        if coords is None:
            raise CodegenError(f"{node.name} does not fit its kernel")
    if looped and not loopable(kernel):
        raise CodegenError(f"kernel of {kernel.nodes[0].name} has no looped form")
    with use_handler(h):
        if looped:
            _looped_reductions(h, [(n, c) for n, c in placed if n.is_reduction()])
        for node, coords in placed:
            if looped and node.is_reduction():
                value = h.registers[node.name]
            else:
                value = _persistent_reduction(h, node, coords) if node.is_reduction() else run_body(node, coords)
            h.registers[node.name] = value
            if node.name in kernel.stored:
                index = store_index(node, coords, kernel)
                h.size_symbols |= size_symbols_of(index)
                mask = "xmask & rmask" if (coords.full and not node.is_reduction() and reduction) else "xmask"
                out = value.text
                if value.dtype != node.buffer.dtype:
                    source = value.dtype
                    if node.buffer.dtype == torch.bfloat16 and value.dtype != torch.float32:
                        out, source = cast(out, torch.float32), torch.float32
                    out = cast(out, node.buffer.dtype, target, source)
                where = render_index(index)
                if not index.has(XINDEX):
                    where += " + 0 * xindex"  # a block of pointers, even for a single element
                h.lines.append(f"tl.store({args[node.name]} + ({where}), {out}, {mask})")
    body = h.lines
    constexprs, num_warps = launch_config(kernel)
    size_args = tuple(sorted(h.size_symbols, key=lambda s: s.name))
    params = [*args.values(), "xnumel"] + (["rnumel"] if reduction else [])
    params += [s.name for s in size_args]
    params += [f"{k}: tl.constexpr" for k in constexprs]
    wide = _needs_int64(kernel, buffers, loads + stores)
    pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
    full_x = tiles_evenly(kernel.xnumel, XBLOCK_MAX)
    if reduction:
        head = [f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]",
                "xmask = tl.full([XBLOCK, 1], True, tl.int1)" if full_x else "xmask = xindex < xnumel"]
        if not looped:
            full_r = tiles_evenly(kernel.rnumel, next_pow2(kernel.rnumel) if not is_symbolic(kernel.rnumel) else 0)
            head += ["rindex = tl.arange(0, RBLOCK)[None, :]",
                     "rmask = tl.full([1, RBLOCK], True, tl.int1)" if full_r else "rmask = rindex < rnumel"]
    else:
        head = [f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)",
                "xmask = tl.full([XBLOCK], True, tl.int1)" if full_x else "xmask = xindex < xnumel"]
    kind = "red" if reduction else "pw"
    text = "\n".join(f"    {line}" for line in head + body)
    # Note: the launch config is part of the name. Two kernels with the same body but different
    # XBLOCK/RBLOCK/num_warps are different kernels: sharing one KernelInfo would launch one of
    # them with the other's block size over a grid sized for its own.
    digest = hashlib.sha256(f"{params}\n{text}\n{sorted(constexprs.items())}\n{num_warps}".encode()
                            ).hexdigest()[:16]
    name = f"fxcc_{kind}_{digest}"
    imports = "import triton\nimport triton.language as tl\n"
    if target == "cuda":
        imports += "from triton.language.extra import libdevice\n"
    source = (f"{imports}\n{HELPERS}\n\n@triton.jit\ndef {name}({', '.join(params)}):\n{text}\n")
    return RenderedKernel(name, source, loads + stores, kernel.xnumel, kernel.rnumel,
                          launch_grid(kernel.xnumel, constexprs["XBLOCK"]), constexprs, num_warps,
                          reduction, size_args)


def _reduce(h: TritonHandler, rtype: str, value: TVal) -> TVal:
    if h.kernel.rnumel == 1:
        return value  # reducing one element leaves it as it is
    masked = h.emit(f"tl.where(xmask & rmask, {value.text}, {_identity(rtype, value.dtype)})", value.dtype)
    if rtype == "sum":
        return h.emit(f"tl.sum({masked.text}, 1)[:, None]", value.dtype)
    return h.emit(f"tl.reduce({masked.text}, 1, _fxcc_{rtype})[:, None]", value.dtype)


def _identity(rtype: str, dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        ident = REDUCE_IDENTITY[rtype]
        return f'float("{ident}")' if isinstance(ident, str) else f"{float(ident)!r}"
    if rtype in ("sum", "prod"):
        return str(REDUCE_IDENTITY[rtype])
    info = torch.iinfo(dtype)
    return str(info.min if rtype == "max" else info.max)


def _persistent_reduction(h: TritonHandler, node: ComputedBuffer, coords: Coords) -> TVal:
    """A reduction over rows in registers: its body over the tile, reduced along r."""
    assert isinstance(node.data, Reduction)
    rtype = node.data.reduction_type
    if rtype not in WELFORD:
        return _reduce(h, rtype, run_body(node, coords))
    key = id(node.data.inner_fn)
    if key not in h.welford:
        value = run_body(node, coords)
        h.welford[key] = _welford_tile(h, value, _first_lane(h, value[0]) if isinstance(value, tuple) else None)
    return h.welford[key][WELFORD.index(rtype)]


def _first_lane(h: TritonHandler, value: TVal) -> TVal:
    """Each row's value at its first lane, from the tile in registers (the shift of partials' means).

    Note: not the body evaluated at rindex 0 (_welford_shift) — a body that reads a value this
    kernel computed reads the register tile, at every lane, whatever index it is given."""
    return h.emit(f"tl.sum(tl.where(rindex == 0, {value.text}, 0.0), 1)[:, None]", value.dtype)


def _welford_shift(h: TritonHandler, node: ComputedBuffer, coords: Coords) -> TVal:
    """Each row's first value (a triple's mean): what a Welford accumulation subtracts first.

    Note: fp32 holds a mean of 1e4 only to 5e-4, five hundredths of a standard deviation of 1e-2;
    accumulated as is, the means' rounding reached m2 (3% off at 1e4 + randn·1e-2, the column
    form). Shifted by a value of the row, the accumulation sees values of the spread's size
    (x - shift is exact when both are within a factor 2) and only the stored mean rounds. Any
    shift is correct; one near the mean is precise.
    """
    zero = [sympy.Integer(0)] * len(coords.rindex)
    value = node.data.inner_fn(coords.index, zero)
    return value[0] if isinstance(value, tuple) else value


def _welford_tile(h: TritonHandler, value: TVal | tuple[TVal, TVal, TVal],
                  shift: TVal | None) -> tuple[TVal, TVal, TVal]:
    """(mean, m2, weight) per row of a Welford body's values over a tile held in registers.

    Note: two passes over the registers rather than Welford's running update: the tile is loaded
    once either way, and the mean first, then the squared deviations from it (Chan's formula for
    triples) is exact to rounding, cheaper than a division per element, and needs no tuple
    reduction. Rows of one element (rnumel 1) are their own statistics.
    """
    mean, m2, weight = value if isinstance(value, tuple) else (value, None, None)
    if h.kernel.rnumel == 1:
        return (mean, m2 or h.constant(0.0, mean.dtype), weight or h.constant(1.0, mean.dtype))
    dt, typ = mean.dtype, TL_DTYPES[mean.dtype]
    w = h.emit(f"tl.where(xmask & rmask, {weight.text if weight else '1.0'}, 0.0).to({typ})", dt)
    centred = mean.text if shift is None else f"{mean.text} - {shift.text}"
    m = h.emit(f"tl.where(xmask & rmask, {centred}, 0.0)", dt)
    q = None if m2 is None else h.emit(f"tl.where(xmask & rmask, {m2.text}, 0.0)", dt)
    # Note: values of weight 1 each (a layer norm's): every row stored (xmask) holds rnumel of
    # them, so the count is rnumel, not a third reduction across the lanes (as Inductor's
    # persistent Welford divides by its static length; a ConvNeXt layer norm over 96 channels
    # took 0.044 ms against Inductor's 0.029 on an H100).
    count = None if weight is not None else h.emit(f"tl.full([XBLOCK, 1], {_rnumel_text(h)}, {typ})", dt)
    stats = _welford_rows(h, m, q, w, count)
    return stats if shift is None else _unshift(h, stats, shift)


def _unshift(h: TritonHandler, stats: tuple[TVal, TVal, TVal], shift: TVal) -> tuple[TVal, TVal, TVal]:
    mean, m2, weight = stats
    return h.emit(f"({shift.text} + {mean.text})", mean.dtype), m2, weight


def _rnumel_text(h: TritonHandler) -> str:
    """The kernel's reduction length: a literal where it is static, else its argument."""
    r = h.kernel.rnumel
    return str(int(r)) if not is_symbolic(r) else "rnumel"


def _welford_rows(h: TritonHandler, mean: TVal, m2: TVal | None, weight: TVal,
                  count: TVal | None = None) -> tuple[TVal, TVal, TVal]:
    """(mean, m2, weight) per row from per-lane ones over an [XBLOCK, RBLOCK] tile, lanes outside
    the rows weighing 0 (and holding 0): Chan's formula across the lanes. `count`: each stored
    row's total weight where it is known (else summed across the lanes)."""
    dt = mean.dtype
    total = count if count is not None else h.emit(f"tl.sum({weight.text}, 1)[:, None]", dt)
    safe = h.emit(f"tl.where({total.text} == 0, 1.0, {total.text})", dt)
    row_mean = h.emit(f"(tl.sum({weight.text} * {mean.text}, 1)[:, None] / {safe.text})", dt)
    dev = h.emit(f"({mean.text} - {row_mean.text})", dt)
    spread = f"{weight.text} * {dev.text} * {dev.text}"
    if m2 is not None:
        spread = f"{m2.text} + {spread}"
    return row_mean, h.emit(f"tl.sum({spread}, 1)[:, None]", dt), total


def _looped_reductions(h: TritonHandler, nodes: list[tuple[ComputedBuffer, Coords]]) -> None:
    """A looped kernel's reductions, each row RBLOCK at a time in one shared `for roffset` loop
    (one accumulator each, three for a Welford body, their bodies' loads emitted once), then
    reduced across the tile; their values go to `h.registers`."""
    shifts = {id(n.data.inner_fn): _welford_shift(h, n, c) for n, c in nodes if n.data.reduction_type in WELFORD}
    outer = h.lines
    h.lines = []
    saved = dict(h.cse)
    values = [run_body(node, coords) for node, coords in nodes]
    inner = h.lines
    h.lines, h.cse = outer, saved
    rmask = ("rmask = tl.full([1, RBLOCK], True, tl.int1)" if tiles_evenly(h.kernel.rnumel, RBLOCK_MAX)
             else "rmask = rindex < rnumel")
    loop = ["rindex = roffset + tl.arange(0, RBLOCK)[None, :]", rmask, *inner]
    accs: dict[str, str] = {}  # node -> accumulator
    welford: dict[int, tuple[TVal, TVal, TVal]] = {}  # a Welford body -> its accumulators
    for (node, _), value in zip(nodes, values):
        assert isinstance(node.data, Reduction)
        rtype = node.data.reduction_type
        if rtype in WELFORD:
            key = id(node.data.inner_fn)
            if key not in welford:
                welford[key] = _welford_accumulate(h, value, shifts[key], outer, loop)
            continue
        acc = accs[node.name] = f"acc{h.counter}"
        h.counter += 1
        outer.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {_identity(rtype, value.dtype)}, {TL_DTYPES[value.dtype]})")
        loop.append(f"{acc} = tl.where(xmask & rmask, {COMBINE[rtype].format(acc, value.text)}, {acc})")
    outer.append("for roffset in range(0, rnumel, RBLOCK):")
    outer.extend(f"    {line}" for line in loop)
    for (node, _), value in zip(nodes, values):
        rtype = node.data.reduction_type
        if rtype in WELFORD:
            key = id(node.data.inner_fn)
            if key not in h.welford:
                h.welford[key] = _unshift(h, _welford_rows(h, *welford[key]), shifts[key])
            h.registers[node.name] = h.welford[key][WELFORD.index(rtype)]
            continue
        acc = accs[node.name]
        total = (f"tl.sum({acc}, 1)[:, None]" if rtype == "sum"
                 else f"tl.reduce({acc}, 1, _fxcc_{rtype})[:, None]")
        h.registers[node.name] = h.emit(total, value.dtype)


def _welford_accumulate(h: TritonHandler, value: TVal | tuple[TVal, TVal, TVal], shift: TVal, outer: list[str],
                        loop: list[str]) -> tuple[TVal, TVal, TVal]:
    """Per-lane (mean - shift, m2, weight) accumulators of a Welford body, initialised in `outer`
    and updated in `loop`: Welford's update for single values, Chan's combination for triples.

    Note: lanes past the row keep their accumulators (the update is selected by the masks), so
    a lane that saw nothing weighs 0 with mean and m2 0, as _welford_rows expects. Weights are
    counted in the accumulation dtype (fp32: exact to 2**24 elements a lane and a row).
    """
    triple = isinstance(value, tuple)
    dt = value[0].dtype if triple else value.dtype
    typ = TL_DTYPES[dt]
    mean, m2, weight = (f"acc{h.counter}_{part}" for part in ("mean", "m2", "weight"))
    h.counter += 1
    outer.extend(f"{acc} = tl.full([XBLOCK, RBLOCK], 0, {typ})" for acc in (mean, m2, weight))
    keep = "xmask & rmask"
    if triple:
        m, q, w = (v.text for v in value)
        loop += [f"{weight}_next = {weight} + {w}",
                 f"{mean}_delta = ({m} - {shift.text}) - {mean}",
                 f"{mean}_frac = {w} / tl.where({weight}_next == 0, 1.0, {weight}_next)",  # 0 when both weigh 0
                 f"{m2} = tl.where({keep}, {m2} + {q} + {mean}_delta * {mean}_delta * {weight} * {mean}_frac, {m2})",
                 f"{mean} = tl.where({keep}, {mean} + {mean}_delta * {mean}_frac, {mean})",
                 f"{weight} = tl.where({keep}, {weight}_next, {weight})"]
    else:
        x = f"{mean}_x"
        loop += [f"{x} = {value.text} - {shift.text}",
                 f"{weight}_next = {weight} + 1.0",
                 f"{mean}_delta = {x} - {mean}",
                 f"{mean}_next = {mean} + {mean}_delta / {weight}_next",
                 f"{m2} = tl.where({keep}, {m2} + {mean}_delta * ({x} - {mean}_next), {m2})",
                 f"{mean} = tl.where({keep}, {mean}_next, {mean})",
                 f"{weight} = tl.where({keep}, {weight}_next, {weight})"]
    return TVal(mean, dt), TVal(m2, dt), TVal(weight, dt)


def _needs_int64(kernel: Kernel, buffers: dict[str, Any], names: list[str]) -> bool:
    limit = 2**31 - 1
    sizes = [kernel.xnumel, kernel.rnumel]
    for name in names:
        b = buffers[name]
        sizes += [b.storage_offset, *b.sizes, *b.strides]
    if is_symbolic(*sizes):
        return True  # Note: correct for every size the symbols may take; int32 would need a guard
    if kernel.xnumel * kernel.rnumel + 4096 >= limit:
        return True
    for name in names:
        b = buffers[name]
        span = b.storage_offset + sum((s - 1) * st for s, st in zip(b.sizes, b.strides)) + 1
        if span >= limit:
            return True
    return False

