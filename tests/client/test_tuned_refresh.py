"""Clients and tuned artifacts: the local cache never trades a tuned copy for an untuned one, and an
untuned local copy is replaced by the service's tuned one once a GPU worker has tuned it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client import remote
from fxcc.client.backend import GraphCompiler
from fxcc.client.cache import LocalCache
from fxcc.client.capture import capture_graph
from fxcc.client.settings import ClientSettings
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest


def _artifacts() -> tuple[Artifact, Artifact]:
    x = torch.randn(16)
    cap = capture_graph(make_fx(lambda t: t.sin() + 1)(x), [x])
    untuned = compile_request(CompileRequest(graph=cap.spec))
    tuned = Artifact(untuned.manifest.model_copy(update={"tuned": True}), untuned.blobs)
    return untuned, tuned


def test_local_cache_keeps_the_tuned_copy(tmp_path: Path) -> None:
    untuned, tuned = _artifacts()
    cache = LocalCache(tmp_path)
    cache.put(untuned)
    assert not cache.get(untuned.manifest.key).manifest.tuned
    cache.put(tuned)
    assert cache.get(untuned.manifest.key).manifest.tuned
    cache.put(untuned)
    assert cache.get(untuned.manifest.key).manifest.tuned


class FakeService:
    """RemoteService's get_artifact, answered from `served` (or raising `error`)."""

    served: Artifact | None = None
    error: Exception | None = None
    asked: ClassVar[list[str]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @classmethod
    def for_settings(cls, *args: Any, **kwargs: Any) -> FakeService:
        return cls()

    def get_artifact(self, key: str) -> Artifact | None:
        FakeService.asked.append(key)
        if FakeService.error is not None:
            raise FakeService.error
        return FakeService.served

    def close(self) -> None:
        pass


@pytest.fixture
def compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GraphCompiler:
    monkeypatch.setattr(remote, "RemoteService", FakeService)
    FakeService.served, FakeService.error, FakeService.asked = None, None, []
    return GraphCompiler(ClientSettings(url="http://fxcc.invalid:8470", cache_dir=tmp_path))


def test_refresh_takes_the_services_tuned_copy(compiler: GraphCompiler) -> None:
    untuned, tuned = _artifacts()
    key = untuned.manifest.key
    compiler.cache.put(untuned)
    FakeService.served = untuned  # not tuned yet: nothing changes
    assert not compiler.refresh_tuned(key) and not compiler.cache.get(key).manifest.tuned
    FakeService.served = tuned
    assert compiler.refresh_tuned(key)
    assert compiler.cache.get(key).manifest.tuned
    assert FakeService.asked == [key, key]


def test_refresh_never_raises(compiler: GraphCompiler) -> None:
    untuned, _ = _artifacts()
    compiler.cache.put(untuned)
    FakeService.error = remote.ServiceError("service unreachable")
    assert not compiler.refresh_tuned(untuned.manifest.key)
    assert not compiler.cache.get(untuned.manifest.key).manifest.tuned
