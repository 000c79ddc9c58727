"""bench.opinfo's worker processes and its results file: (op, dtype) tasks on spawned workers, a
worker that crashes, hangs or loses its CUDA context replaced, the JSON rewritten as tasks end."""

from __future__ import annotations

import collections
import json
import logging
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from bench.opinfo import Outcome, op_infos, sweep_op


def _worker_main(conn: Any, device: str, max_samples: int) -> None:
    """Run the tasks sent on `conn`, answering each with its outcomes (as dicts)."""
    import warnings

    import torch

    warnings.simplefilter("ignore")
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)
    infos = op_infos()
    conn.send(("ready", None))
    while True:
        task = conn.recv()
        if task is None:
            return
        op, dtype = task
        try:
            outcomes = [asdict(o) for o in sweep_op(infos[op], dtype, device, max_samples)]
        except Exception as e:  # noqa: BLE001
            outcomes = [asdict(Outcome(op, dtype, -1, "errored", f"{type(e).__name__}: {str(e)[:200]}"))]
        healthy = True
        if device == "cuda":
            try:
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a CUDA error poisons this process's context
                outcomes.append(asdict(Outcome(op, dtype, -1, "errored", f"CUDA context lost: {str(e)[:200]}")))
                healthy = False
        conn.send(("done", outcomes))
        if not healthy:
            os._exit(3)


class _Worker:
    def __init__(self, ctx: Any, device: str, max_samples: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, device, max_samples), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.task: tuple[str, str] | None = None
        self.started = 0.0

    def give(self, task: tuple[str, str]) -> None:
        self.task, self.started = task, time.monotonic()
        self.conn.send(task)

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)


class Results:
    """Every outcome so far, written to `path` (atomically) after a task once `every_s` has passed
    since the last write, and at the end."""

    def __init__(self, path: Path | None, meta: dict[str, Any], every_s: float = 2.0) -> None:
        self.path, self.meta, self.every_s = path, meta, every_s
        self.outcomes: list[dict[str, Any]] = []
        self.not_reached: list[tuple[str, str]] = []
        self.unfinished: list[tuple[str, str]] = []
        self._written = 0.0

    def add(self, outcomes: list[dict[str, Any]]) -> None:
        self.outcomes += outcomes
        if time.monotonic() - self._written >= self.every_s:
            self.write()

    def write(self) -> None:
        if self.path is None:
            return
        self._written = time.monotonic()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.report(), indent=1) + "\n")
        os.replace(tmp, self.path)

    def report(self) -> dict[str, Any]:
        return {**self.meta, "dtypes": summarize(self.outcomes, self.not_reached, self.unfinished)}


def summarize(outcomes: list[dict[str, Any]], not_reached: list[tuple[str, str]] = (),  # type: ignore[assignment]
              unfinished: list[tuple[str, str]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """Per dtype: sample and op counts, every mismatch with its errors, every error, skip reasons."""
    per: dict[str, Any] = {}
    for o in outcomes:
        d = per.setdefault(o["dtype"], {"ops": set(), "samples": collections.Counter(), "mismatched": [],
                                        "errored": [], "skipped": collections.Counter(), "notes": [],
                                        "fxcc_eager": [],
                                        "ops_failing": set(), "ops_native": set()})
        d["ops"].add(o["op"])
        d["samples"][o["status"]] += 1
        if o["status"] == "mismatched":
            d["mismatched"].append({k: o[k] for k in ("op", "sample", "errors", "verdict", "detail")})
            if o["verdict"] == "wrong":
                d["ops_failing"].add(o["op"])
        elif o["status"] == "errored":
            d["errored"].append({"op": o["op"], "sample": o["sample"], "message": o["detail"]})
            d["ops_failing"].add(o["op"])
        elif o["status"] == "skipped":
            d["skipped"][o["detail"].split(":")[0]] += 1
            if not o["detail"].startswith(("eager", "aot_eager", "samples")):  # fxcc's own refusal
                d["fxcc_eager"].append({"op": o["op"], "sample": o["sample"], "why": o["detail"]})
        if o["status"] == "passed" and o["lowered"] and not o["extern_ops"]:
            d["ops_native"].add(o["op"])
        d["notes"] += [{"op": o["op"], "sample": o["sample"], "note": n} for n in o.get("notes", [])]
    out = {}
    for dtype, d in sorted(per.items()):
        out[dtype] = {
            "ops": len(d["ops"]), "samples": dict(d["samples"]),
            "passed": d["samples"]["passed"], "mismatched": d["mismatched"], "errored": d["errored"],
            "skipped": sum(d["skipped"].values()), "skip_reasons": dict(d["skipped"].most_common()),
            "skipped_as_fxcc_runs_them_eagerly": d["fxcc_eager"],
            "wrong": sum(1 for m in d["mismatched"] if m["verdict"] == "wrong"),
            "rounding": sum(1 for m in d["mismatched"] if m["verdict"] == "rounding"),
            "ops_failing": sorted(d["ops_failing"]),  # candidates for tests/opinfo/test_opinfo_ci.py
            "ops_fully_native": len(d["ops_native"]),
            "compiler_notes": d["notes"][:200],
        }
    for dtype in {dt for _, dt in list(not_reached) + list(unfinished)} | set(out):
        d = out.setdefault(dtype, {"ops": 0, "passed": 0, "mismatched": [], "errored": [], "skipped": 0})
        d["not_reached"] = sorted(op for op, dt in not_reached if dt == dtype)
        d["unfinished"] = sorted(op for op, dt in unfinished if dt == dtype)
    return dict(sorted(out.items()))


def run_pool(tasks: list[tuple[str, str]], device: str, workers: int, max_samples: int,
             results: Results, budget_s: float | None, task_timeout_s: float, grace_s: float,
             progress: Callable[[str], None]) -> None:
    """Run `tasks` on `workers` processes; a worker that dies or overruns is replaced. After
    `budget_s` no task starts; `grace_s` later the tasks still running are stopped."""
    ctx = mp.get_context("spawn")  # never fork a process that may hold a CUDA context
    t0 = time.monotonic()
    pending = collections.deque(tasks)
    pool = [_Worker(ctx, device, max_samples) for _ in range(min(workers, len(tasks)))]
    done = failed_starts = 0
    try:
        while pool:
            over = budget_s is not None and time.monotonic() - t0 > budget_s
            if over and time.monotonic() - t0 > budget_s + grace_s:  # type: ignore[operator]
                progress(f"[{time.monotonic() - t0:6.0f}s] time budget and grace spent: stopping")
                break
            for w in list(pool):
                if w.ready and w.task is None:
                    if pending and not over:
                        w.give(pending.popleft())
                    else:
                        w.conn.send(None)
                        w.proc.join(10)
                        pool.remove(w)
            ready = wait([w.conn for w in pool] + [w.proc.sentinel for w in pool], timeout=1.0)
            now = time.monotonic()
            for w in list(pool):
                lost = None
                if w.conn in ready:
                    try:
                        kind, payload = w.conn.recv()
                    except (EOFError, OSError):
                        kind, payload = "lost", None
                    if kind == "ready":
                        w.ready = True
                        continue
                    if kind == "done":
                        results.add(payload)
                        done += 1
                        status = collections.Counter(o["status"] for o in payload)
                        progress(f"[{now - t0:6.0f}s {done}/{len(tasks)}] {w.task[0]} {w.task[1]}: "
                                 + ", ".join(f"{k} {v}" for k, v in sorted(status.items())))
                        w.task = None
                        if w.proc.is_alive():
                            continue
                        lost = None  # it exited after answering (a lost CUDA context)
                    else:
                        lost = "worker died"
                elif w.proc.sentinel in ready or not w.proc.is_alive():
                    lost = "worker died"
                elif w.task is not None and now - w.started > task_timeout_s:
                    lost = f"timed out after {task_timeout_s:.0f} s"
                else:
                    continue
                if w.task is not None:
                    op, dtype = w.task
                    if lost == "worker died":
                        w.proc.join(5)
                        lost += f" (exit code {w.proc.exitcode})"
                    done += 1
                    results.add([asdict(Outcome(op, dtype, -1, "errored", lost or "worker lost"))])
                    progress(f"[{now - t0:6.0f}s] {op} {dtype}: {lost}")
                w.stop()
                pool.remove(w)
                failed_starts += not w.ready
                if failed_starts >= 3:
                    progress("workers die before their first task (their stderr says why): stopping")
                    return
                over = budget_s is not None and now - t0 > budget_s
                if pending and not over:
                    pool.append(_Worker(ctx, device, max_samples))
    finally:
        for w in pool:
            if w.task is not None:
                results.unfinished.append(w.task)
            w.stop()
        results.not_reached = list(pending)
        results.write()


def run_inline(tasks: list[tuple[str, str]], device: str, max_samples: int, results: Results,
               budget_s: float | None, progress: Callable[[str], None]) -> None:
    """The same, in this process (for the CPU suite: no process per test)."""
    infos = op_infos()
    t0 = time.monotonic()
    pending = collections.deque(tasks)
    while pending:
        if budget_s is not None and time.monotonic() - t0 > budget_s:
            break
        op, dtype = pending.popleft()
        try:
            outcomes = sweep_op(infos[op], dtype, device, max_samples)
        except Exception as e:  # noqa: BLE001
            outcomes = [Outcome(op, dtype, -1, "errored", f"{type(e).__name__}: {traceback.format_exc(limit=2)[-200:]}")]
        results.add([asdict(o) for o in outcomes])
        progress(f"[{time.monotonic() - t0:6.0f}s] {op} {dtype}: "
                 + ", ".join(f"{o.status}{'/' + o.verdict if o.verdict else ''}" for o in outcomes))
    results.not_reached = list(pending)
    results.write()
