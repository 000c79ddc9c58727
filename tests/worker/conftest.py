"""The worker tests use the service tests' fixtures (settings, stores, requests); Redis comes from tests/conftest.py."""

from __future__ import annotations

from tests.service import conftest as _fixtures

redis_settings = _fixtures.redis_settings
embedded_settings = _fixtures.embedded_settings
redis_store = _fixtures.redis_store
store = _fixtures.store
make_unary = _fixtures.make_unary
make_sum = _fixtures.make_sum
