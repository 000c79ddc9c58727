"""Manifest signatures: hex HMAC-SHA256 under the workers' shared key over canonical manifest JSON.

Canonical JSON is `json.dumps(manifest, sort_keys=True, separators=(",", ":"))` of the manifest
as the API returns it, so a client can verify what it received without our models.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from fxcc.compiler_core.artifact import ArtifactManifest, canonical_json


def sign_manifest(manifest: ArtifactManifest, key: bytes) -> str:
    return hmac.new(key, canonical_json(manifest.model_dump(mode="json")), hashlib.sha256).hexdigest()


def verify_manifest(manifest: dict[str, Any], signature: str | None, key: bytes) -> bool:
    """True when `signature` is the HMAC of `manifest` (a decoded JSON object) under `key`."""
    if not signature:
        return False
    expected = hmac.new(key, canonical_json(manifest), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature)
