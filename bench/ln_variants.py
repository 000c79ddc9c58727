"""Hand-written variants of the bias+GELU+LayerNorm row kernel fxcc generates (16384x1024, fp32 and
bf16), timed on a GPU with triton.testing.do_bench_cudagraph (device time, no launch overhead), beside
a same-size copy: what masks, eviction hints, looping over rows with the parameters held in
registers, tile shapes, and the GELU itself cost.

`python -m bench.ln_variants OUT.json` (every variant) or `python -m bench.ln_variants OUT.json --nogelu`
(the kernel with and without its GELU: how much of its time is arithmetic), `--fasterf` (libdevice's
erf against a cheaper erfc, with their errors). A diagnostic, not part
of `bench.run`; session 6's results are in results/logs/h200-s6-runD-ln-*.json.
"""
import functools
import itertools
import json
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.testing import do_bench_cudagraph

ROWS, COLS = 16384, 1024


@triton.jit
def base(in0, in1, in2, in3, out0, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
         EVICT: tl.constexpr, MASK: tl.constexpr, GELU: tl.constexpr = 1):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rindex = tl.arange(0, RBLOCK)[None, :]
    if MASK:
        m = (xindex < xnumel) & (rindex < rnumel)
        rm = rindex < rnumel
    else:
        m = None
        rm = None
    if EVICT:
        x = tl.load(in0 + (rindex + RBLOCK * xindex), m, eviction_policy="evict_first").to(tl.float32)
        b = tl.load(in1 + rindex, rm, eviction_policy="evict_last").to(tl.float32)
    else:
        x = tl.load(in0 + (rindex + RBLOCK * xindex), m).to(tl.float32)
        b = tl.load(in1 + rindex, rm).to(tl.float32)
    h = x + b
    if GELU == 1:
        g = h * (0.5 * (1.0 + libdevice.erf(h * 0.7071067811865476)))
    elif GELU == 2:  # Phi(h) from Abramowitz & Stegun 7.1.26's erfc (|error| <= 1.5e-7)
        z = tl.abs(h) * 0.7071067811865476
        t = tl.fdiv(1.0, 1.0 + 0.3275911 * z, ieee_rounding=False)
        p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        q = p * tl.exp(-z * z)
        g = h * tl.where(h >= 0, 1.0 - 0.5 * q, 0.5 * q)
    else:
        g = h
    mean = tl.sum(g, 1)[:, None] / RBLOCK
    d = g - mean
    var = tl.sum(d * d, 1)[:, None] / RBLOCK
    r = libdevice.rsqrt(var + 1e-5)
    if EVICT:
        w = tl.load(in2 + rindex, rm, eviction_policy="evict_last").to(tl.float32)
        c = tl.load(in3 + rindex, rm, eviction_policy="evict_last").to(tl.float32)
    else:
        w = tl.load(in2 + rindex, rm).to(tl.float32)
        c = tl.load(in3 + rindex, rm).to(tl.float32)
    y = d * r * w + c
    tl.store(out0 + (rindex + RBLOCK * xindex), y.to(out0.dtype.element_ty), m)


@triton.jit
def looped(in0, in1, in2, in3, out0, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
           EVICT: tl.constexpr):
    rindex = tl.arange(0, RBLOCK)[None, :]
    b = tl.load(in1 + rindex).to(tl.float32)
    w = tl.load(in2 + rindex).to(tl.float32)
    c = tl.load(in3 + rindex).to(tl.float32)
    for start in range(tl.program_id(0) * XBLOCK, xnumel, tl.num_programs(0) * XBLOCK):
        xindex = start + tl.arange(0, XBLOCK)[:, None]
        m = xindex < xnumel
        if EVICT:
            x = tl.load(in0 + (rindex + RBLOCK * xindex), m, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(in0 + (rindex + RBLOCK * xindex), m).to(tl.float32)
        h = x + b
        g = h * (0.5 * (1.0 + libdevice.erf(h * 0.7071067811865476)))
        mean = tl.sum(g, 1)[:, None] / RBLOCK
        d = g - mean
        var = tl.sum(d * d, 1)[:, None] / RBLOCK
        r = libdevice.rsqrt(var + 1e-5)
        y = d * r * w + c
        tl.store(out0 + (rindex + RBLOCK * xindex), y.to(out0.dtype.element_ty), m)


@triton.jit
def copyk(in0, out0, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out0 + i, tl.load(in0 + i, i < n), i < n)


def _time(kernel, grid, *args, **kw) -> float:
    """Device time (ms) of one launch, after a first launch that compiles it and fills `out`."""
    launch = functools.partial(kernel[grid], *args, **kw)
    launch()
    return do_bench_cudagraph(launch)


def _inputs(dtype):
    x = torch.randn(ROWS, COLS, device="cuda", dtype=dtype)
    params = [torch.randn(COLS, device="cuda", dtype=dtype) for _ in range(3)]
    return x, params, torch.empty_like(x)


def nogelu() -> dict:
    res = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, (b, w, c), out = _inputs(dtype)
        t = {"aten_copy": do_bench_cudagraph(functools.partial(out.copy_, x))}
        for xb, nw, gelu in itertools.product((1, 2, 4), (4, 8), (1, 0)):
            t[f"x{xb}_w{nw}_gelu{gelu}"] = _time(base, (ROWS // xb,), x, b, w, c, out, ROWS, COLS, XBLOCK=xb,
                                                 RBLOCK=COLS, EVICT=0, MASK=0, GELU=gelu, num_warps=nw)
        res[str(dtype)] = t
        print(dtype, {k: round(v * 1000, 2) for k, v in t.items()})
    return res


def fasterf() -> dict:
    """The kernel with libdevice's erf (GELU=1), a cheaper erfc (GELU=2) and none (GELU=0): device time
    and the largest difference from an fp64 reference."""
    res = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, (b, w, c), out = _inputs(dtype)
        ref = torch.nn.functional.layer_norm(torch.nn.functional.gelu(x.double() + b.double()), (COLS,),
                                             w.double(), c.double())
        t = {"aten_copy": do_bench_cudagraph(functools.partial(out.copy_, x))}
        for xb, nw, gelu in itertools.product((1, 2, 4), (4, 8), (1, 2, 0)):
            ms = _time(base, (ROWS // xb,), x, b, w, c, out, ROWS, COLS, XBLOCK=xb, RBLOCK=COLS, EVICT=0, MASK=0,
                       GELU=gelu, num_warps=nw)
            t[f"x{xb}_w{nw}_gelu{gelu}"] = (round(ms * 1000, 2), (out.double() - ref).abs().max().item())
        res[str(dtype)] = t
        print(dtype, t)
    return res


def variants() -> dict:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, (b, w, c), out = _inputs(dtype)
        ref = torch.nn.functional.layer_norm(torch.nn.functional.gelu(x.float() + b.float()), (COLS,),
                                             w.float(), c.float())
        t = {"aten_copy": do_bench_cudagraph(functools.partial(out.copy_, x)),
             "triton_copy_4096": _time(copyk, (triton.cdiv(x.numel(), 4096),), x, out, x.numel(), BLOCK=4096,
                                       num_warps=8)}
        for xb, nw in itertools.product((1, 2, 4, 8), (4, 8)):
            for ev, mk in ((0, 1), (1, 1), (0, 0)):
                ms = _time(base, (ROWS // xb,), x, b, w, c, out, ROWS, COLS, XBLOCK=xb, RBLOCK=COLS, EVICT=ev,
                           MASK=mk, num_warps=nw)
                t[f"base_x{xb}_w{nw}_ev{ev}_m{mk}"] = (ms, (out.float() - ref).abs().max().item())
            for k, ev in itertools.product((2, 4, 8) if xb < 8 else (), (0, 1)):
                grid = (min(ROWS // xb, sms * k),)
                ms = _time(looped, grid, x, b, w, c, out, ROWS, COLS, XBLOCK=xb, RBLOCK=COLS, EVICT=ev, num_warps=nw)
                t[f"loop_x{xb}_w{nw}_k{k}_ev{ev}"] = (ms, (out.float() - ref).abs().max().item())
        res[str(dtype).removeprefix("torch.")] = t
        best = sorted(((v[0] if isinstance(v, tuple) else v), k) for k, v in t.items())[:12]
        print(dtype, "copy", t["aten_copy"])
        for v, k in best:
            print(f"  {k}: {v * 1000:.2f} us")
    return res


if __name__ == "__main__":
    result = nogelu() if "--nogelu" in sys.argv else fasterf() if "--fasterf" in sys.argv else variants()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
