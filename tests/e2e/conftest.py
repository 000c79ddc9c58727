"""E2E fixtures: a cluster of real processes (`fxcc serve` on Redis, with a token and a signing key,
and one `fxcc worker`) under the test's own Redis prefix (tests/e2e/cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import client_env_of, running_cluster


@pytest.fixture
def cluster(redis_url: str, redis_prefix: str, tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, str]]]:
    """A real service and a real worker process on the test's Redis prefix: (url, their environment).
    Clients authenticate with env["FXCC_TOKEN"] (the principal `FXCC_TOKEN`); the worker signs with a
    key pair made for the test, whose public key clients trust (client_env). A test marked
    `@pytest.mark.service_env(NAME="value")` runs them with those settings too."""
    marker = request.node.get_closest_marker("service_env")
    with running_cluster(redis_url, redis_prefix, tmp_path, marker.kwargs if marker else None) as running:
        yield running


@pytest.fixture
def client_env(cluster: tuple[str, dict[str, str]]) -> dict[str, str]:
    """The environment of a client process of `cluster`: FXCC_URL, the token, and the workers' public
    key as FXCC_TRUSTED_KEYS; no Redis, no private key."""
    return client_env_of(*cluster)
