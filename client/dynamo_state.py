"""The Dynamo-skip cache's process state (client/dynamo_cache.py, client/package_load.py): what was
loaded and compiled, counters, the service client, where packages live in the local cache, and
what is said once."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fxcc.client.pre_aot import Once

if TYPE_CHECKING:
    from fxcc.client.dynamo_cache import FxccCompiled
    from fxcc.client.package_load import PackageLoad

log = logging.getLogger("fxcc.dynamo_cache")


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.once = Once()
        self.counts: dict[str, int] = {}
        self.compiled: dict[str, FxccCompiled] = {}  # Dynamo's backend id -> fxcc's callable
        self.saved: dict[str, str] = {}  # package key -> digest of what was last written
        self.enabled = False
        self.last_load: PackageLoad | None = None  # where the last package load's time went (bench/)
        self.loads: list[PackageLoad] = []  # loads whose side thread may still run (deferred writes)
        self.remotes: dict[tuple, Any] = {}  # (url, token, ...) -> RemoteService
        self.compiling = threading.local()  # .active: a frame of an fxcc package compiles on this thread


_state = _State()


def load_timings() -> dict[str, float]:
    """Seconds of the last package load (`PackageLoad.timings`): read (disk or service), verify,
    unpickle; on its side thread the artifacts' fetch, the plans, the warm-up (cubins preloaded,
    library calls) and when it was ready; what torch.compile waited for the plans and the first call
    for the rest; total (install included); how many cubins were preloaded."""
    with _state.lock:
        load = _state.last_load
    return load.timings() if load is not None else {}


def join_loads(timeout_s: float | None = None, flush: bool = False) -> bool:
    """Wait for every package load's side thread to end (its deferred local-cache writes done);
    `flush`: do not wait for the graphs' first calls first (as at exit). Whether all ended."""
    with _state.lock:
        loads = list(_state.loads)
    for load in loads:
        if flush:
            load.flush()
        if load.thread is not None:
            load.thread.join(timeout_s)
    with _state.lock:
        _state.loads[:] = [x for x in _state.loads if x.thread is not None and x.thread.is_alive()]
        return not _state.loads


def count(name: str) -> None:
    with _state.lock:
        _state.counts[name] = _state.counts.get(name, 0) + 1


def counters() -> dict[str, int]:
    """hits, misses, refused (bad or foreign signature), errors, saved, shared, not_saved."""
    with _state.lock:
        return dict(_state.counts)


def log_once(cause: str, message: str, *args: Any) -> None:
    if _state.once.first(cause):
        log.info("fxcc: Dynamo package cache: " + message, *args)


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _remote(settings: Any) -> Any:
    """This process's client of the service for `settings` (one connection pool: a package and its
    artifacts come over one connection; an httpx client costs 30 ms to make on the H200's host)."""
    from fxcc.client.remote import RemoteService

    ident = (settings.url, settings.token, settings.request_timeout_s, settings.allow_unsigned,
             str(getattr(settings, "trusted_keys", "")))
    with _state.lock:
        remote = _state.remotes.get(ident)
        if remote is None:
            remote = _state.remotes[ident] = RemoteService.for_settings(settings)
    return remote


def _local_path(settings: Any, key: str) -> Path:
    return Path(settings.cache_dir) / "dynamo" / f"{key}.pkg"


def _write_local(settings: Any, key: str, data: bytes) -> None:
    from fxcc.compiler_core.artifact import atomic_write

    try:
        atomic_write(_local_path(settings, key), data)
    except OSError as e:
        log_once(f"write:{type(e).__name__}", "cannot write %s: %s", _local_path(settings, key), e)
