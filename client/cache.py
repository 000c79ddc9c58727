"""The local disk cache of artifacts (content-addressed blobs, manifests written last)."""

from __future__ import annotations

import logging
from pathlib import Path

from fxcc.compiler_core.artifact import Artifact, ArtifactManifest, load_artifact, save_artifact, supersedes

log = logging.getLogger("fxcc.cache")


class LocalCache:
    def __init__(self, root: Path) -> None:
        self.root = root / "artifacts"

    def get(self, key: str) -> Artifact | None:
        return load_artifact(self.root, key)

    def put(self, artifact: Artifact) -> None:
        """Store `artifact` unless the local copy is tuned and it is not (as the service's stores do)."""
        try:
            if not supersedes(artifact.manifest, self._manifest(artifact.manifest.key)):
                return
            save_artifact(self.root, artifact)
        except OSError as e:  # a read-only or full disk must not stop the user's program
            log.warning("fxcc: could not write the local cache at %s: %s", self.root, e)

    def _manifest(self, key: str) -> ArtifactManifest | None:
        try:
            return ArtifactManifest.model_validate_json((self.root / "manifests" / f"{key}.json").read_bytes())
        except (OSError, ValueError):
            return None
