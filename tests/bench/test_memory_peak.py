"""bench.memory_peak's replay of an allocator trace to its peak (its GPU run is on the H100/H200)."""

from __future__ import annotations

from bench.memory_peak import group_key, live_at_peak

MB = 1024 * 1024
FXCC = {"filename": "/tmp/site/fxcc/client/training_graphs.py", "line": 310, "name": "_capture"}
MODEL = {"filename": "/site/transformers/models/gpt2/modeling_gpt2.py", "line": 9, "name": "forward"}
TORCH = {"filename": "/site/torch/autograd/graph.py", "line": 5, "name": "_engine_run_backward"}
BENCH = {"filename": "/repo/bench/memory_peak.py", "line": 1, "name": "call"}


def ev(action, addr, mb, *frames):
    return {"action": action, "addr": addr, "size": int(mb * MB), "frames": list(frames)}


def test_the_peak_is_the_most_bytes_alive_and_lists_what_was_alive_then():
    trace = [
        ev("alloc", 1, 4, TORCH, FXCC, BENCH),       # call 1
        ev("alloc", 2, 8, MODEL, BENCH),
        ev("free_requested", 1, 4),                   # still counted until completed
        ev("alloc", 3, 1, TORCH, BENCH),              # 13 MB: the peak
        ev("free_completed", 1, 4),
        ev("free_completed", 77, 1000),               # allocated before the trace: ignored
        ev("alloc", 4, 2, MODEL),                     # call 2: 11 MB
    ]
    got = live_at_peak(trace, marks=[0, 6])
    assert got["peak_mb"] == 13.0 and got["at_event"] == 3 and got["call"] == 1
    assert [(g["where"], g["mb"], g["blocks"]) for g in got["groups"]] == [
        ("model gpt2/modeling_gpt2.py:9 forward", 8.0, 1),
        ("fxcc client/training_graphs.py:310 _capture", 4.0, 1),
        ("torch autograd/graph.py:5 _engine_run_backward", 1.0, 1),
    ]
    later = live_at_peak(trace + [ev("alloc", 5, 5, MODEL)], marks=[0, 6])
    assert later["peak_mb"] == 16.0 and later["call"] == 2
    assert later["groups"][0] == {"where": "model gpt2/modeling_gpt2.py:9 forward", "mb": 15.0, "blocks": 3,
                                  "largest_mb": 8.0, "frames": ["gpt2/modeling_gpt2.py:9 forward", "bench/memory_peak.py:1 call"]}


def test_blocks_are_named_by_fxcc_first_then_the_model_then_torch():
    assert group_key([TORCH, MODEL, FXCC, BENCH]).startswith("fxcc client/training_graphs.py:310")
    assert group_key([TORCH, MODEL, BENCH]) == "model gpt2/modeling_gpt2.py:9 forward"
    assert group_key([TORCH, BENCH]) == "torch autograd/graph.py:5 _engine_run_backward"
    assert group_key([]) == "(no python frame)"
