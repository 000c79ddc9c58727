"""Bundles: several artifacts (a model's graphs) framed as one body of bytes, as the service stores
and serves them (`GET /v1/bundles/{key}`, issue 24) and the client reads them.

Layout (every length in bytes):

    b"FXCCBDL1"                  magic
    32 hex digits                the ETag: blake2b-128 of everything after the prefix
    b"i" or b"s"                 immutable (every artifact tuned or for the CPU interpreter) or not
    4 hex digits                 how many artifacts it holds
    8 hex digits, b"\\n"          the header's length
    header                       JSON: {"bundle": key, "artifacts": [[key, manifest bytes, signature
                                 or null], ...], "blobs": [[digest, bytes], ...], "missing": [keys],
                                 "rest": [keys]}
    payload                      the manifests in the header's order, then the blobs (each once)

Note: the prefix is fixed so that the service answers a stored bundle without parsing it: its ETag
cache class and artifact count are bytes 8-45. The manifests are the stored JSON as the workers wrote (and signed)
it; nothing is re-encoded, nothing base64'd. `missing`: asked keys the cache lacks; `rest`: keys not
in this bundle because it reached its byte bound (their own bundle holds them: `bundle_key(rest)`).
The reader trusts none of it: the client checks every signature and digest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from fxcc.compiler_core.errors import ArtifactError

MAGIC = b"FXCCBDL1"
PREFIX_BYTES = len(MAGIC) + 32 + 1 + 4 + 8 + 1
MAX_ARTIFACTS = 0xFFFF
IMMUTABLE, SUPERSEDABLE = b"i", b"s"


class BundleError(ArtifactError):
    """A bundle that does not parse or does not answer what was asked."""


def bundle_key(keys: list[str]) -> str:
    """The bundle key of a set of artifact keys (order and repeats do not matter)."""
    text = "\n".join(sorted(set(keys)))
    return hashlib.sha256(b"fxcc-bundle-v1\n" + text.encode()).hexdigest()


@dataclass(frozen=True)
class BundledArtifact:
    key: str
    manifest_json: bytes
    signature: str | None
    blobs: list[tuple[str, bytes]]  # (digest, bytes) of every blob its manifest names


@dataclass(frozen=True)
class Bundle:
    key: str
    artifacts: list[tuple[str, bytes, str | None]]  # (key, manifest JSON, signature)
    blobs: dict[str, bytes]
    missing: list[str]
    rest: list[str]


def encode_bundle(key: str, artifacts: list[BundledArtifact], missing: list[str], rest: list[str],
                  immutable: bool) -> bytes:
    """The framed bytes of a bundle; a blob that several artifacts name goes in once."""
    blobs: dict[str, bytes] = {}
    for art in artifacts:
        for d, data in art.blobs:
            blobs.setdefault(d, data)
    header = json.dumps({"bundle": key,
                         "artifacts": [[a.key, len(a.manifest_json), a.signature] for a in artifacts],
                         "blobs": [[d, len(b)] for d, b in blobs.items()], "missing": missing, "rest": rest},
                        separators=(",", ":")).encode()
    body = b"".join([header, *(a.manifest_json for a in artifacts), *blobs.values()])
    tag = hashlib.blake2b(body, digest_size=16).hexdigest().encode()
    flag = IMMUTABLE if immutable else SUPERSEDABLE
    if len(artifacts) > MAX_ARTIFACTS:
        raise BundleError(f"{len(artifacts)} artifacts in one bundle, over {MAX_ARTIFACTS}")
    return b"".join([MAGIC, tag, flag, b"%04x%08x\n" % (len(artifacts), len(header)), body])


@dataclass(frozen=True)
class Prefix:
    etag: str  # 32 hex digits
    immutable: bool
    artifacts: int


def stored_prefix(data: bytes) -> Prefix | None:
    """What a stored bundle's prefix says; None when `data` is not a bundle."""
    if len(data) < PREFIX_BYTES or not data.startswith(MAGIC) or data[PREFIX_BYTES - 1:PREFIX_BYTES] != b"\n":
        return None
    flag = data[40:41]
    try:
        count = int(data[41:45], 16)
    except ValueError:
        return None
    if flag not in (IMMUTABLE, SUPERSEDABLE):
        return None
    return Prefix(data[8:40].decode("latin-1"), flag == IMMUTABLE, count)


def decode_bundle(data: bytes, asked: list[str]) -> Bundle:
    """The bundle in `data`, asked for as the keys `asked`; raises BundleError unless it parses, its
    lengths add up, and it names only asked keys (each asked key in one of artifacts, missing, rest)."""
    if stored_prefix(data) is None:
        raise BundleError("not an fxcc bundle (bad prefix)")
    try:
        size = int(data[45:53], 16)
        header = json.loads(data[PREFIX_BYTES:PREFIX_BYTES + size])
        key = header["bundle"]
        entries = [(str(k), int(n), s) for k, n, s in header["artifacts"]]
        blob_sizes = [(str(d), int(n)) for d, n in header["blobs"]]
        missing = [str(k) for k in header["missing"]]
        rest = [str(k) for k in header["rest"]]
    except (ValueError, TypeError, KeyError) as e:
        raise BundleError(f"bundle header does not parse: {e}") from None
    if key != bundle_key(asked):
        raise BundleError(f"bundle {str(key)[:12]} answered for bundle {bundle_key(asked)[:12]}")
    named = [k for k, _, _ in entries] + missing + rest
    if sorted(named) != sorted(set(asked)) or any(s is not None and not isinstance(s, str) for _, _, s in entries):
        raise BundleError(f"bundle {key[:12]} does not answer the keys asked")
    pos = PREFIX_BYTES + size
    sizes = [n for _, n, _ in entries] + [n for _, n in blob_sizes]
    if min(sizes, default=0) < 0 or pos + sum(sizes) != len(data):
        raise BundleError(f"bundle {key[:12]}: its lengths do not add up to its {len(data)} bytes")
    view = memoryview(data)
    artifacts = []
    for k, n, sig in entries:
        artifacts.append((k, bytes(view[pos:pos + n]), sig))
        pos += n
    blobs = {}
    for d, n in blob_sizes:
        blobs[d] = bytes(view[pos:pos + n])
        pos += n
    return Bundle(key, artifacts, blobs, missing, rest)
