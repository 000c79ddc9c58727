"""The local disk cache of artifacts (content-addressed blobs, manifests written last)."""

from __future__ import annotations

import logging
from pathlib import Path

from compiler_core.artifact import Artifact, load_artifact, save_artifact

log = logging.getLogger("fxcc.cache")


class LocalCache:
    def __init__(self, root: Path) -> None:
        self.root = root / "artifacts"

    def get(self, key: str) -> Artifact | None:
        return load_artifact(self.root, key)

    def put(self, artifact: Artifact) -> None:
        try:
            save_artifact(self.root, artifact)
        except OSError as e:  # a read-only or full disk must not stop the user's program
            log.warning("fxcc: could not write the local cache at %s: %s", self.root, e)
