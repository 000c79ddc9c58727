"""Ed25519 manifest signatures: what verifies, what does not, and the key files."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from fxcc.compiler_core.signing import (
    PublicKey,
    Signer,
    SigningKeyError,
    TrustedKeys,
    generate,
    load_or_create,
    read_public_keys,
    write_key_pair,
)

MANIFEST = {"key": "ab" * 32, "blobs": {"k0.py": "cd" * 32}, "tuned": False, "plan": {"steps": [1, 2]}}


def test_a_signature_verifies_under_its_key_only() -> None:
    signer, other = Signer(generate()[0]), Signer(generate()[0])
    sig = signer.sign_json(MANIFEST)
    assert TrustedKeys([signer.public]).check(MANIFEST, sig) is None
    assert TrustedKeys([other.public, signer.public]).verify(MANIFEST, sig)  # several keys: rotation
    assert "not trusted" in TrustedKeys([other.public]).check(MANIFEST, sig)
    assert "not trusted" in TrustedKeys().check(MANIFEST, sig)


@pytest.mark.parametrize("edit", [
    lambda m: {**m, "tuned": True},
    lambda m: {**m, "blobs": {"k0.py": "ef" * 32}},  # a blob swapped: its digest is in the manifest
    lambda m: {**m, "key": "00" * 32},
    lambda m: {**m, "extra": 1},
])
def test_any_edit_of_the_manifest_breaks_the_signature(edit) -> None:
    signer = Signer(generate()[0])
    sig = signer.sign_json(MANIFEST)
    assert "does not match" in TrustedKeys([signer.public]).check(edit(dict(MANIFEST)), sig)


def test_key_order_does_not_matter_canonical_json() -> None:
    signer = Signer(generate()[0])
    sig = signer.sign_json(MANIFEST)
    assert TrustedKeys([signer.public]).verify(dict(reversed(list(MANIFEST.items()))), sig)


def test_a_signature_claiming_a_trusted_key_id_with_another_keys_bytes_fails() -> None:
    signer, forger = Signer(generate()[0]), Signer(generate()[0])
    forged = forger.sign_json(MANIFEST).replace(forger.public.id, signer.public.id)
    assert "does not match" in TrustedKeys([signer.public]).check(MANIFEST, forged)


@pytest.mark.parametrize("sig", [None, "", "deadbeef" * 8, "ed25519:abc", "ed25519:a:b:c", "ed25519:x:!!!",
                                 "hmac:1234:abcd"])
def test_malformed_signatures_are_refused_with_a_reason(sig) -> None:
    signer = Signer(generate()[0])
    why = TrustedKeys([signer.public]).check(MANIFEST, sig)
    assert why is not None and isinstance(why, str)


@pytest.mark.parametrize("text", ["", "abc", "fxcc-ed25519:", "fxcc-ed25519:" + base64.b64encode(b"x" * 31).decode(),
                                  "fxcc-ed25519:not base64!"])
def test_bad_public_keys_say_what_is_wrong(text: str) -> None:
    with pytest.raises(SigningKeyError):
        PublicKey(text)


def test_a_private_key_is_not_accepted_as_a_public_one() -> None:
    private, _ = generate()
    with pytest.raises(SigningKeyError, match="private key"):
        read_public_keys(private)
    with pytest.raises(SigningKeyError):
        Signer(generate()[1])  # and a public key does not sign


def test_key_files(tmp_path: Path) -> None:
    private, public = tmp_path / "w.key", tmp_path / "w.key.pub"
    signer = write_key_pair(private, public)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert [k.id for k in read_public_keys(str(public))] == [signer.public.id]
    with pytest.raises(FileExistsError):
        write_key_pair(private, public)  # never overwrites a key
    # A file of several keys, with comments: rotation.
    other = Signer(generate()[0])
    keys = tmp_path / "trusted"
    keys.write_text(f"# workers\n{public.read_text()}\n\n{other.public.text}  # the new key\n")
    assert {k.id for k in read_public_keys(str(keys))} == {signer.public.id, other.public.id}
    keys.write_text("fxcc-ed25519:garbage\n")
    with pytest.raises(SigningKeyError, match=r"trusted:1"):
        read_public_keys(str(keys))
    with pytest.raises(SigningKeyError, match="trusted key file"):
        read_public_keys(str(tmp_path / "missing.pub"))


def test_load_or_create_keeps_one_pair(tmp_path: Path) -> None:
    a = load_or_create(tmp_path / "keys" / "signing.key", tmp_path / "keys" / "signing.pub")
    b = load_or_create(tmp_path / "keys" / "signing.key", tmp_path / "keys" / "signing.pub")
    assert a.public.id == b.public.id
    assert read_public_keys(str(tmp_path / "keys" / "signing.pub"))[0].id == a.public.id
    assert "PRIVATE" not in repr(a).upper() and a.public.id in repr(a)
