"""Manifest signatures: Ed25519. Workers sign with a private key; clients hold public keys only.

A signature covers the canonical JSON of the manifest as the API returns it
(`json.dumps(manifest, sort_keys=True, separators=(",", ":"))`), and through the manifest's blob
digests every blob: a client checks the signature, then each blob against its digest, before it
loads any kernel. Digests alone catch corruption, not forgery (a forged manifest lists its own
digests); a signature by a key the client trusts is what makes an artifact code it may run.

Text forms (one line each, safe in an environment variable or a Kubernetes secret):
- private key: `fxcc-ed25519-private:<base64 of the 32-byte seed>` (`fxcc keygen` writes one);
- public key:  `fxcc-ed25519:<base64 of the 32-byte key>`;
- signature:   `ed25519:<key id>:<base64 of the 64-byte signature>`, the key id being the first 16
  hex digits of the sha256 of the public key, so a client holding several keys (rotation) knows
  which one to try, and an operator can tell which key signed an artifact.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fxcc.compiler_core.artifact import ArtifactManifest, canonical_json
from fxcc.compiler_core.errors import FxccError

PRIVATE_PREFIX = "fxcc-ed25519-private:"
PUBLIC_PREFIX = "fxcc-ed25519:"
SIGNATURE_PREFIX = "ed25519:"


class SigningKeyError(FxccError):
    """A signing or public key that is not in fxcc's form (the message says which and why)."""


def _raw(text: str, prefix: str, what: str) -> bytes:
    text = text.strip()
    if not text.startswith(prefix):
        raise SigningKeyError(f"{what} must start with {prefix!r} (fxcc keygen makes one); got {text[:24]!r}...")
    try:
        raw = base64.b64decode(text[len(prefix):], validate=True)
    except (binascii.Error, ValueError):
        raise SigningKeyError(f"{what} is not valid base64 after {prefix!r}") from None
    if len(raw) != 32:
        raise SigningKeyError(f"{what} must hold 32 bytes, not {len(raw)}")
    return raw


def key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


class PublicKey:
    """One trusted public key."""

    def __init__(self, text: str) -> None:
        self.raw = _raw(text, PUBLIC_PREFIX, "a public key")
        self.key = Ed25519PublicKey.from_public_bytes(self.raw)
        self.id = key_id(self.raw)

    @property
    def text(self) -> str:
        return PUBLIC_PREFIX + base64.b64encode(self.raw).decode()

    def __repr__(self) -> str:
        return f"PublicKey({self.id})"


class Signer:
    """A worker's private key: signs manifests."""

    def __init__(self, text: str) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(_raw(text, PRIVATE_PREFIX, "a signing key"))
        self.public = PublicKey(PUBLIC_PREFIX + base64.b64encode(
            self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode())

    def sign(self, manifest: ArtifactManifest) -> str:
        return self.sign_json(manifest.model_dump(mode="json"))

    def sign_json(self, manifest: dict[str, Any]) -> str:
        sig = self._key.sign(canonical_json(manifest))
        return f"{SIGNATURE_PREFIX}{self.public.id}:{base64.b64encode(sig).decode()}"

    def __repr__(self) -> str:  # never the key itself
        return f"Signer({self.public.id})"


class TrustedKeys:
    """The public keys a client (or a tuning worker) accepts signatures from; several at once for
    rotation."""

    def __init__(self, keys: Iterable[PublicKey] = ()) -> None:
        self.by_id = {k.id: k for k in keys}

    def __bool__(self) -> bool:
        return bool(self.by_id)

    def __len__(self) -> int:
        return len(self.by_id)

    def ids(self) -> list[str]:
        return sorted(self.by_id)

    def check(self, manifest: dict[str, Any], signature: str | None) -> str | None:
        """None when `signature` is a valid signature of `manifest` (decoded JSON) by a trusted key,
        else why not, in words."""
        if not signature:
            return "it is not signed"
        if not signature.startswith(SIGNATURE_PREFIX) or signature.count(":") != 2:
            return "its signature is not an fxcc Ed25519 signature"
        _, kid, b64 = signature.split(":")
        key = self.by_id.get(kid)
        if key is None:
            return f"it is signed by key {kid[:16]!r}, which is not trusted"
        try:
            key.key.verify(base64.b64decode(b64, validate=True), canonical_json(manifest))
        except (InvalidSignature, binascii.Error, ValueError):
            return f"its signature by key {kid} does not match its manifest"
        return None

    def verify(self, manifest: dict[str, Any], signature: str | None) -> bool:
        return self.check(manifest, signature) is None


def generate() -> tuple[str, str]:
    """A new key pair as (private text, public text)."""
    key = Ed25519PrivateKey.generate()
    from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    signer = Signer(PRIVATE_PREFIX + base64.b64encode(seed).decode())
    return PRIVATE_PREFIX + base64.b64encode(seed).decode(), signer.public.text


def write_key_pair(private_path: Path, public_path: Path) -> Signer:
    """A new key pair in two files: the private one readable by its owner only. Refuses to
    overwrite either file."""
    for p in (private_path, public_path):
        if p.exists():
            raise FileExistsError(f"{p} exists; not overwriting a key")
    private, public = generate()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(private + "\n")
    public_path.write_text(public + "\n")
    return Signer(private)


def load_or_create(private_path: Path, public_path: Path) -> Signer:
    """The key pair under these paths, made on first use (the embedded service's own pair)."""
    if not private_path.exists():
        try:
            return write_key_pair(private_path, public_path)
        except FileExistsError:  # another process made it meanwhile
            pass
    signer = Signer(private_path.read_text())
    if not public_path.exists() or PublicKey(public_path.read_text()).id != signer.public.id:
        public_path.write_text(signer.public.text + "\n")
    return signer


def read_public_keys(entry: str) -> list[PublicKey]:
    """Public keys from one entry of a trusted-keys setting: a key itself, or a file holding keys
    one per line (blank lines and `#` comments skipped)."""
    entry = entry.strip()
    if entry.startswith(PUBLIC_PREFIX):
        return [PublicKey(entry)]
    if entry.startswith(PRIVATE_PREFIX):
        raise SigningKeyError("a private key was given where public keys are expected; give its public key "
                        "(the .pub file fxcc keygen wrote)")
    path = Path(entry).expanduser()
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise SigningKeyError(f"trusted key file {path}: {e.strerror or e}") from None
    keys = []
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if line:
            try:
                keys.append(PublicKey(line))
            except SigningKeyError as e:
                raise SigningKeyError(f"{path}:{n}: {e}") from None
    return keys
