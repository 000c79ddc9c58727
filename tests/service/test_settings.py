"""Settings come from FXCC_* variables; Redis keys all live under the prefix; URLs are logged redacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxcc.service.keys import RedisKeys
from fxcc.service.settings import ServiceSettings, redacted_url


def test_env_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FXCC_REDIS_URL", "redis://example:6379/3")
    monkeypatch.setenv("FXCC_PORT", "9999")
    monkeypatch.setenv("FXCC_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FXCC_JOB_MAX_ATTEMPTS", "5")
    s = ServiceSettings()
    assert (s.redis_url, s.port, s.data_dir, s.job_max_attempts) == ("redis://example:6379/3", 9999, tmp_path, 5)


def test_defaults_mean_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FXCC_REDIS_URL", raising=False)
    s = ServiceSettings()
    assert s.redis_url is None and s.redis_prefix == "fxcc:" and s.port == 8470
    assert s.max_request_bytes == 32 * 1024 * 1024


def test_bad_value_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FXCC_PORT", "not-a-port")
    with pytest.raises(ValueError, match="port"):
        ServiceSettings()


def test_every_key_is_under_the_prefix() -> None:
    k = RedisKeys("p:")
    names = [k.blob("d"), k.manifest("m"), k.signature("m"), k.job("j"), k.inflight("m"), k.worker("w"),
             k.cache_counters, k.manifest_index, k.dead_letter, k.recent_jobs, k.tokens, k.live_workers, *k.streams()]
    assert all(n.startswith("p:") for n in names)
    assert k.streams() == ("p:jobs:interactive", "p:jobs:precompile")


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:secret@host:6379/0", "redis://:***@host:6379/0"),
    ("redis://user:secret@host/0", "redis://user:***@host/0"),
    ("redis://host:6379/0", "redis://host:6379/0"),
])
def test_redacted_url(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
