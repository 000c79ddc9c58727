"""The worker tests use the service tests' fixtures (settings, stores, requests); Redis comes from tests/conftest.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# Note: loaded by path, not imported: tests/ has no __init__.py (a `tests.service` package would
# shadow the real `service`).
_spec = importlib.util.spec_from_file_location(
    "fxcc_service_test_fixtures", Path(__file__).parent.parent / "service" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

redis_settings = _fixtures.redis_settings
embedded_settings = _fixtures.embedded_settings
redis_store = _fixtures.redis_store
store = _fixtures.store
make_unary = _fixtures.make_unary
make_sum = _fixtures.make_sum
