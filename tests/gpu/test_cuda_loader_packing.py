"""The cubin launcher's parameter packing and guards, checked anywhere (the driver call is faked).

Runs on CPU-only machines too: what reaches cuLaunchKernel is read back from the packed buffer.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from fxcc.client import cuda_loader
from fxcc.client.cuda_loader import CubinKernel, LaunchMeta, StepLauncher
from fxcc.compiler_core.errors import ArtifactError


def _meta(signature: tuple[str, ...], scratch: int = 2, div16: tuple[int, ...] = ()) -> LaunchMeta:
    return LaunchMeta(name="k", num_warps=8, shared=1024, signature=signature, scratch_params=scratch,
                      global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                      align16=tuple(i for i, t in enumerate(signature) if t.startswith("*")), div16=div16)


@pytest.fixture
def launches(monkeypatch):  # type: ignore[no-untyped-def]
    seen: list[dict[str, object]] = []

    def fake_launch(fn, gx, gy, gz, block, shared, stream, params, device):  # type: ignore[no-untyped-def]
        seen.append({"fn": fn, "grid": (gx, gy, gz), "block": block, "shared": shared,
                     "stream": stream, "params": params, "device": device})

    monkeypatch.setattr(cuda_loader, "_launch", fake_launch)
    monkeypatch.setattr(cuda_loader, "_raw_stream", lambda device: 1234)
    monkeypatch.setattr(CubinKernel, "handle", lambda self, device: f"fn@{device}")
    return seen


def _read(params: int, types: list[type[ctypes._SimpleCData]]) -> list[int]:
    slots = (ctypes.c_void_p * len(types)).from_address(params)
    return [ty.from_address(slots[i]).value for i, ty in enumerate(types)]


def test_parameters_reach_the_driver_in_kernel_order(launches):
    sig = ("*fp32", "i32", "*bf16", "i64")
    launcher = StepLauncher(CubinKernel(b"", _meta(sig)), [5, 2], ["a", -7, "b", 1 << 40])
    a, b = torch.empty(64), torch.empty(64, dtype=torch.bfloat16)
    assert launcher([a, b], 0) is True
    (call,) = launches
    assert call["grid"] == (5, 2, 1) and call["block"] == 256 and call["shared"] == 1024
    assert call["stream"] == 1234 and call["fn"] == "fn@0"
    types = [ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint64]
    assert _read(int(call["params"]), types) == [a.data_ptr(), -7, b.data_ptr(), 1 << 40, 0, 0]


def test_new_pointers_each_launch_and_unaligned_ones_refused(launches):
    launcher = StepLauncher(CubinKernel(b"", _meta(("*fp32", "*fp32", "i32"))), [1], ["x", "y", 9])
    x, y = torch.empty(32), torch.empty(32)
    launcher([x, y], 0)
    launcher([y, x], 0)
    got = [_read(int(c["params"]), [ctypes.c_uint64, ctypes.c_uint64]) for c in launches]
    assert got[-1] == [y.data_ptr(), x.data_ptr()]
    assert launcher([x[1:], y], 0) is False  # 4-byte offset: the cubin assumed 16-byte alignment
    assert len(launches) == 2


def test_int_divisibility_guard_is_checked_at_load():
    meta = _meta(("*fp32", "i32"), div16=(1,))
    launcher = StepLauncher(CubinKernel(b"", meta), [1], ["x", 32])
    assert launcher.static_guards_hold(["x", 32])
    assert not launcher.static_guards_hold(["x", 33])


def test_mismatched_step_is_refused():
    with pytest.raises(ArtifactError):
        StepLauncher(CubinKernel(b"", _meta(("*fp32", "i32"))), [1], ["x"])
    with pytest.raises(ArtifactError):
        StepLauncher(CubinKernel(b"", _meta(("*fp32", "i32"))), [1], [3, 4])


def test_metadata_round_trip_from_the_build_keys():
    md: dict[str, int | str] = {
        "sm_90.name": "k", "sm_90.num_warps": 4, "sm_90.shared": 0, "sm_90.signature": "*fp32,i32",
        "sm_90.scratch_params": 2, "sm_90.global_scratch_size": 0, "sm_90.global_scratch_align": 1,
        "sm_90.profile_scratch_size": 0, "sm_90.guard_align16": "0", "sm_90.guard_div16": "",
    }
    meta = LaunchMeta.from_metadata(md, "sm_90")
    assert meta.signature == ("*fp32", "i32") and meta.align16 == (0,) and meta.div16 == ()
    with pytest.raises(ArtifactError):
        LaunchMeta.from_metadata(md, "sm_80")
