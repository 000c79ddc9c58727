"""Pre-AOT entries shared through a real service (client/pre_aot.py's Shared): a machine with an empty
local cache skips AOTAutograd for what another one compiled; the key holds nothing machine-local; a
service that fails, stalls or is down costs only the optimisation, never the program."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fxcc.client import backend, pre_aot
from fxcc.client.demo import free_port
from fxcc.client.settings import ClientSettings


@pytest.fixture
def service(fresh_compiles: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real `fxcc serve` app (embedded store and worker) under uvicorn in a thread of this process,
    anonymous on loopback; FXCC_URL points at it, and FXCC_DATA_DIR at its data dir, so the client
    trusts the key its worker signs with, as on one machine. Yields the app (its store is app.state.store)."""
    import uvicorn

    from fxcc.service.app import create_app
    from fxcc.service.settings import ServiceSettings

    app = create_app(ServiceSettings(redis_url=None, data_dir=tmp_path / "service", claim_block_ms=100))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-fxcc-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    monkeypatch.setenv("FXCC_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("FXCC_DATA_DIR", str(tmp_path / "service"))
    yield app
    server.should_exit = True
    thread.join(60)


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32)).eval(), torch.randn(4, 16)


def _compile_on(cache: Path, model: nn.Module, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    """Compile and run `model` as a new process on a machine whose local cache is `cache` would."""
    monkeypatch.setenv("FXCC_CACHE_DIR", str(cache))
    torch._dynamo.reset()
    with torch.no_grad():
        return torch.compile(model, backend="fxcc")(x)


def _service_entries(app: Any, principal: str = "anonymous") -> list[Path]:
    folder = app.state.store.root / "pre_aot" / hashlib.sha256(principal.encode()).hexdigest()[:32]
    return sorted(folder.glob("*.json"))


def test_a_new_machine_skips_aot_autograd_through_the_service(service: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = _model()
    with torch.no_grad():
        expected = model(x)
    first = _compile_on(tmp_path / "machine-a", model, x, monkeypatch)
    assert backend.aot_runs() == 1
    assert (backend.events()[-1].source, backend.events()[-1].pre_aot) == (
        "remote-compiled", "ran; stored for the next process")
    assert len(_service_entries(service)) == 1  # PUT to the service, under this client's principal

    # Machine B: empty local cache. The service's entry and artifact serve it; AOTAutograd never runs.
    second = _compile_on(tmp_path / "machine-b", model, x, monkeypatch)
    assert backend.aot_runs() == 1
    event = backend.events()[-1]
    assert (event.source, event.pre_aot) == ("remote-hit", "skipped: pre-AOT cache hit from the service")
    assert event.key == backend.events()[0].key
    torch.testing.assert_close(second, expected)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    assert len(list((tmp_path / "machine-b" / "pre_aot").glob("*.json"))) == 1  # kept locally too

    # Machine B's next process needs no service: entry and artifact are local now.
    monkeypatch.delenv("FXCC_URL")
    third = _compile_on(tmp_path / "machine-b", model, x, monkeypatch)
    assert backend.aot_runs() == 1
    assert (backend.events()[-1].source, backend.events()[-1].pre_aot) == ("local-hit", "skipped: pre-AOT cache hit")
    torch.testing.assert_close(third, expected)


def test_an_entry_whose_artifact_is_gone_is_a_miss(service: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = _model()
    _compile_on(tmp_path / "machine-a", model, x, monkeypatch)
    artifact_key = backend.events()[-1].key
    assert service.state.store.delete_artifact(artifact_key)
    got = _compile_on(tmp_path / "machine-b", model, x, monkeypatch)
    assert backend.aot_runs() == 2  # the entry named nothing the service still had: AOTAutograd ran
    assert backend.events()[-1].pre_aot == "ran; stored for the next process"
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))
    assert len(_service_entries(service)) == 1  # rewritten after the compile, naming the new artifact
    assert service.state.store.get_manifest(artifact_key) is not None


def test_the_key_holds_nothing_machine_local() -> None:
    """The same graph on two machines (another service URL, token, cache dir) has one key; another
    compile mode, which changes what compiles, has another."""
    model, x = _model()
    machines = [ClientSettings(), ClientSettings(url="http://fxcc.other:8470", token="t", trusted_keys=("k.pub",),
                                                 cache_dir=Path("/elsewhere"), request_timeout_s=1.0)]
    keys: list[str] = []

    def keyed(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        keys.extend(pre_aot.graph_key(gm, example_inputs, s)
                    for s in [*machines, ClientSettings(mode="max-autotune")])
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=keyed)(x)
    torch._dynamo.reset()
    assert len(keys) == 3 and keys[0] == keys[1] != keys[2]


@pytest.mark.parametrize("failure", ["error", "stall", "down"])
def test_a_failing_service_is_a_miss_and_the_program_runs(service: Any, tmp_path: Path, failure: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = _model()
    _compile_on(tmp_path / "machine-a", model, x, monkeypatch)  # the service holds entry and artifact
    store = service.state.store
    release = threading.Event()
    if failure == "error":
        def broken(*args: Any) -> Any:
            raise RuntimeError("pre-AOT entries are broken")
        monkeypatch.setattr(store, "get_pre_aot", broken)
        monkeypatch.setattr(store, "put_pre_aot", broken)
    elif failure == "stall":
        real = store.get_pre_aot

        def stalled(*args: Any) -> Any:  # the entry, once the client has stopped waiting for it
            release.wait(30)
            return real(*args)
        monkeypatch.setattr(store, "get_pre_aot", stalled)
        monkeypatch.setattr(pre_aot, "SERVICE_TIMEOUT_S", 0.2)
    else:
        monkeypatch.setenv("FXCC_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        got = _compile_on(tmp_path / "machine-b", model, x, monkeypatch)
    finally:
        release.set()
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))
    assert backend.aot_runs() == 2  # the look-up missed: AOTAutograd ran
    event = backend.events()[-1]
    if failure == "down":
        assert event.source == "fallback"
    else:  # the compile itself still went through the service
        assert (event.source, event.pre_aot) == ("remote-hit", "ran; stored for the next process")
