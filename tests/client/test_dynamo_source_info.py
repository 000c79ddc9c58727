"""A Dynamo package records each inlined function's source once per function, not once per inlining."""

from __future__ import annotations

import dataclasses
import types

import pytest

from fxcc.client.dynamo_precompile import _patch_source_info


def _package_module(calls: list[object], fail: set[object]) -> types.SimpleNamespace:
    """A stand-in for torch._dynamo.package: its SourceInfo records one entry per code object."""

    @dataclasses.dataclass
    class SourceInfo:
        inlined_sources: set

        def add_code(self, code: object) -> None:
            calls.append(code)
            if code in fail:
                raise AssertionError(f"Source mismatch for {code}")
            self.inlined_sources.add(("record", code))

    return types.SimpleNamespace(SourceInfo=SourceInfo)


def _codes() -> tuple[types.CodeType, types.CodeType]:
    def block(x): return x + 1
    def attn(x): return x * 2
    return block.__code__, attn.__code__


def test_a_function_inlined_in_every_layer_is_read_once_and_recorded_in_each_package():
    calls: list[object] = []
    pk = _package_module(calls, set())
    _patch_source_info(pk)
    block, attn = _codes()
    first, second = pk.SourceInfo(inlined_sources=set()), pk.SourceInfo(inlined_sources=set())
    for _ in range(48):  # a 48-layer model inlines its block's functions once per layer
        first.add_code(block)
        first.add_code(attn)
    second.add_code(block)
    assert calls == [block, attn]  # torch's own recording ran once per function
    assert first.inlined_sources == {("record", block), ("record", attn)}
    assert second.inlined_sources == {("record", block)}


def test_a_record_that_fails_fails_each_time():
    _, attn = _codes()
    calls: list[object] = []
    pk = _package_module(calls, {attn})
    _patch_source_info(pk)
    info = pk.SourceInfo(inlined_sources=set())
    for _ in range(2):
        with pytest.raises(AssertionError, match="Source mismatch"):
            info.add_code(attn)
    assert calls == [attn, attn] and info.inlined_sources == set()


def test_another_torchs_source_info_is_left_alone():
    class SourceInfo:  # not the dataclass this torch has
        def add_code(self, code: object) -> None:
            pass

    pk = types.SimpleNamespace(SourceInfo=SourceInfo)
    original = SourceInfo.add_code
    _patch_source_info(pk)
    assert pk.SourceInfo.add_code is original
