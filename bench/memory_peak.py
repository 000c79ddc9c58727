"""What is alive at a compiler's peak memory: the allocator's trace of a bench/model_zoo.py model's
first calls (training steps: forward, backward, AdamW), replayed to the moment the most bytes were
allocated, with every live block grouped by the code that allocated it (GPU machine).

    python3 -m bench.memory_peak --model gpt2_train --compilers fxcc,inductor --out $OUT

One process, one compiler after another, each in a fresh window (Dynamo reset, cuBLAS workspaces
and the cache emptied, as bench.models' PeakWindow does): each compiler's peak beyond what was
allocated before its first call (weights and inputs), which call it fell in, and the blocks alive
then, biggest groups first, each with its allocating frames (fxcc's own frame first where there is
one; a block allocated inside a CUDA-graph capture says so through fxcc's capture frame). Writes
`DIR/memory-peak-<model>.json`. bench.models measures the same peak (max_memory_allocated over the
first calls); this says what it is made of.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

MB = 1024 * 1024
OWN = ("/fxcc/", "/client/", "/compiler_core/", "/worker/", "/service/")


def _frame(f: dict[str, Any]) -> str:
    name = f.get("filename", "?")
    parts = name.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{f.get('line', '?')} {f.get('name', '?')}"


def group_key(frames: list[dict[str, Any]]) -> str:
    """Where a block comes from: the innermost frame of fxcc's own code, else the innermost frame
    outside torch (the model's code), else the innermost frame; frames are innermost first."""
    if not frames:
        return "(no python frame)"
    for f in frames:
        if any(p in f.get("filename", "") for p in OWN) and "/bench/" not in f.get("filename", ""):
            return "fxcc " + _frame(f)
    for f in frames:
        fn = f.get("filename", "")
        if "/torch/" not in fn and "/bench/" not in fn and not fn.startswith("<"):
            return "model " + _frame(f)
    return "torch " + _frame(frames[0])


def live_at_peak(events: Iterable[dict[str, Any]], marks: list[int] | None = None) -> dict[str, Any]:
    """Replay an allocator trace (torch.cuda.memory._snapshot()'s device_traces[i]): the moment the
    bytes allocated in it were highest, and the blocks alive then. A block counts from its `alloc`
    to its `free_completed` (the allocator's own accounting: a free waiting on another stream's
    event still holds its bytes); frees of blocks allocated before the trace began are ignored, so
    the numbers are beyond what was alive when recording started. `marks` are event indices at
    which calls began: the peak's call is the last mark at or before it (1-based)."""
    live: dict[int, dict[str, Any]] = {}
    now = best = 0
    best_at = -1
    best_live: list[dict[str, Any]] = []  # the blocks alive at the peak (a second pass to it)
    evs = list(events)
    for i, e in enumerate(evs):
        act = e.get("action")
        if act == "alloc":
            live[e["addr"]] = e
            now += e["size"]
            if now > best:
                best, best_at = now, i
        elif act == "free_completed":
            blk = live.pop(e["addr"], None)
            if blk is not None:
                now -= blk["size"]
    if best_at >= 0:
        live2: dict[int, dict[str, Any]] = {}
        for e in evs[: best_at + 1]:
            if e.get("action") == "alloc":
                live2[e["addr"]] = e
            elif e.get("action") == "free_completed":
                live2.pop(e["addr"], None)
        best_live = list(live2.values())
    groups: dict[str, dict[str, Any]] = defaultdict(lambda: {"mb": 0.0, "blocks": 0, "largest_mb": 0.0})
    for b in best_live:
        k = group_key(b.get("frames") or [])
        g = groups[k]
        g["mb"] += b["size"] / MB
        g["blocks"] += 1
        g["largest_mb"] = max(g["largest_mb"], b["size"] / MB)
        g.setdefault("frames", [_frame(f) for f in (b.get("frames") or [])[:12]])
    call = None
    if marks and best_at >= 0:
        call = sum(1 for m in marks if m <= best_at) or None
    rows = sorted(groups.items(), key=lambda kv: -kv[1]["mb"])
    return {"peak_mb": round(best / MB, 1), "at_event": best_at, "events": len(evs), "call": call,
            "groups": [{"where": k, **v, "mb": round(v["mb"], 1), "largest_mb": round(v["largest_mb"], 1)}
                       for k, v in rows]}


def profile(name: str, compiler: str, calls: int) -> dict[str, Any]:
    import torch

    from bench.model_zoo import ZOO
    from bench.models import PeakWindow, compiled, training_step

    spec = ZOO[name]
    built = spec.build("cuda", False)
    training = spec.kind == "training"
    module = built.module.train() if training else built.module.eval()
    mode = {"inductor": "inductor_default", "inductor_ro": "inductor_reduce_overhead"}.get(compiler, compiler)
    window = PeakWindow("cuda")
    window.start()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=2_000_000)
    fn = compiled(mode, module)
    if training:
        params = [p for p in module.parameters() if p.requires_grad]
        for p in params:
            p.grad = None
        call = training_step(fn, torch.optim.AdamW(params, lr=1e-4, fused=True), built.inputs)
    else:
        def call() -> Any:
            if mode == "inductor_reduce_overhead":
                torch.compiler.cudagraph_mark_step_begin()
            with torch.no_grad():
                return fn(*built.inputs)
    marks: list[int] = []
    per_call = []
    for _ in range(calls):
        torch.cuda.synchronize()
        marks.append(len(torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]))
        out = call()
        torch.cuda.synchronize()
        per_call.append(round((torch.cuda.memory_allocated() - window.base) / MB, 1))
        del out
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, reserved = window.peak_mb()
    res = live_at_peak(snap["device_traces"][torch.cuda.current_device()], marks)
    res.update({"compiler": compiler, "allocator_peak_mb": peak, "reserved_peak_mb": reserved,
                "allocated_after_each_call_mb": per_call,
                "pools": sorted({(str(s.get("segment_pool_id")), round(s["total_size"] / MB, 1)) for s in snap["segments"]})})
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a bench/model_zoo.py model (gpt2_train, resnet18...)")
    ap.add_argument("--compilers", default="fxcc,inductor", help="fxcc, inductor, inductor_ro, eager")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    doc: dict[str, Any] = {"model": args.model, "compilers": {}}
    for c in args.compilers.split(","):
        r = profile(args.model, c, args.calls)
        doc["compilers"][c] = r
        print(f"== {args.model} {c}: peak {r['peak_mb']} MB in the trace (allocator {r['allocator_peak_mb']}) "
              f"in call {r['call']}; allocated after each call {r['allocated_after_each_call_mb']}", flush=True)
        for g in r["groups"][: args.top]:
            print(f"   {g['mb']:9.1f} MB {g['blocks']:5d} blocks (largest {g['largest_mb']:.1f})  {g['where']}", flush=True)
            print("        " + " <- ".join(g["frames"][:5]), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"memory-peak-{args.model}.json")
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
