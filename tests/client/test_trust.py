"""Which keys a client trusts, and what it does with an artifact no trusted key signed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fxcc.client.remote import RemoteService, trusted_keys
from fxcc.client.settings import ClientSettings
from fxcc.compiler_core.errors import FxccError
from fxcc.compiler_core.signing import Signer, generate, load_or_create, write_key_pair


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data dir of the local `fxcc serve` that holds no key yet."""
    monkeypatch.setenv("FXCC_DATA_DIR", str(tmp_path / "service"))
    return tmp_path / "service"


def test_no_keys_means_nothing_is_trusted(home: Path) -> None:
    assert not trusted_keys(ClientSettings(url="http://svc"))


def test_named_keys_and_files_are_trusted(home: Path, tmp_path: Path) -> None:
    a = write_key_pair(tmp_path / "a.key", tmp_path / "a.key.pub")
    b = Signer(generate()[0])
    s = ClientSettings.from_env({"FXCC_URL": "http://svc", "FXCC_TRUSTED_KEYS": f"{tmp_path / 'a.key.pub'}, "
                                                                              f"{b.public.text}"})
    assert trusted_keys(s).ids() == sorted([a.public.id, b.public.id])


def test_a_bad_entry_is_an_error_not_an_empty_trust(home: Path, tmp_path: Path) -> None:
    with pytest.raises(FxccError, match="trusted key file"):
        trusted_keys(ClientSettings(url="http://svc", trusted_keys=(str(tmp_path / "typo.pub"),)))


def test_the_local_services_own_key_is_trusted_only_if_safe(home: Path) -> None:
    signer = load_or_create(home / "keys" / "signing.key", home / "keys" / "signing.pub")
    assert trusted_keys(ClientSettings(url="http://127.0.0.1:8470")).ids() == [signer.public.id]
    os.chmod(home / "keys" / "signing.pub", 0o666)  # anyone could swap it: not a key to trust
    assert not trusted_keys(ClientSettings(url="http://127.0.0.1:8470"))


def test_allow_unsigned_is_an_explicit_opt_out() -> None:
    assert RemoteService.for_settings(ClientSettings(url="http://svc", allow_unsigned=True)).trusted is None
    s = ClientSettings.from_env({"FXCC_URL": "http://svc", "FXCC_ALLOW_UNSIGNED": "1"})
    assert s.allow_unsigned and RemoteService.for_settings(s).trusted is None
    assert RemoteService.for_settings(ClientSettings(url="http://svc")).trusted is not None


def _doctor(env: dict[str, str]) -> dict[str, dict]:
    run = subprocess.run([sys.executable, "-m", "fxcc", "doctor", "--json"], env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    return {c["name"]: c for c in json.loads(run.stdout)}


def test_doctor_warns_of_the_opt_out_and_fails_without_a_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(FXCC_URL="http://127.0.0.1:9", FXCC_DATA_DIR=str(tmp_path / "service"),
               FXCC_CACHE_DIR=str(tmp_path / "cache"))
    assert _doctor(env)["signatures"]["ok"] is False
    assert _doctor(dict(env, FXCC_ALLOW_UNSIGNED="1"))["signatures"]["ok"] == "warn"
    write_key_pair(tmp_path / "w.key", tmp_path / "w.key.pub")
    checks = _doctor(dict(env, FXCC_TRUSTED_KEYS=str(tmp_path / "w.key.pub")))
    assert checks["signatures"]["ok"] is True and "1 trusted key" in checks["signatures"]["detail"]


def test_keygen_writes_a_pair_and_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "cluster.key"
    cmd = [sys.executable, "-m", "fxcc", "keygen", "--out", str(out)]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert first.returncode == 0, first.stderr
    signer = Signer(out.read_text())
    assert signer.public.text in first.stdout and (tmp_path / "cluster.key.pub").read_text().strip() == \
        signer.public.text
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 1 and "not overwriting" in again.stderr
    assert Signer(out.read_text()).public.id == signer.public.id
