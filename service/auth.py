"""API tokens and roles: who may call what. Tokens are kept and compared only as sha256 digests.

Roles: `client` compiles and reads its own jobs, artifacts and status; `admin` may also see and
abort every job, read stats and metrics, manage the cache and manage tokens (only with a token:
an anonymous admin, the embedded default's, never reaches the token routes).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

from fxcc.service.settings import Role, ServiceSettings
from fxcc.service.store import ANONYMOUS, Store, TokenRecord

ROLE_RANK: dict[str, int] = {"client": 1, "admin": 2}


@dataclass(frozen=True)
class Principal:
    """Who made a request: a token's name and role, or `anonymous`."""

    name: str
    role: Role
    anonymous: bool = False  # no token: never allowed to make or revoke tokens, whatever its role

    def may(self, role: Role) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[role]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "fxcc_" + secrets.token_urlsafe(32)


def settings_tokens(settings: ServiceSettings) -> list[TokenRecord]:
    """The tokens FXCC_TOKEN and FXCC_TOKENS configure; plain ones are hashed here."""
    out = []
    if settings.token is not None:
        out.append(TokenRecord(name="FXCC_TOKEN", role="admin", source="settings",
                               sha256=hash_token(settings.token.get_secret_value())))
    for t in settings.tokens:
        digest = t.sha256 or hash_token(t.token.get_secret_value())  # type: ignore[union-attr]
        out.append(TokenRecord(name=t.name, role=t.role, sha256=digest, source="settings"))
    return out


class Authenticator:
    """Maps a bearer token to a Principal: settings' tokens first, then the store's (cached briefly)."""

    def __init__(self, settings: ServiceSettings, store: Store) -> None:
        self.store = store
        self.configured = settings_tokens(settings)
        self.anonymous = (Principal(ANONYMOUS, settings.effective_anonymous_role, anonymous=True)
                          if settings.anonymous_allowed else None)
        # A token made or revoked over the API takes effect on every process within this.
        self.cache_s = settings.token_cache_s
        self._cache: dict[str, tuple[float, TokenRecord | None]] = {}
        self._lock = threading.Lock()

    def principal(self, token: str | None) -> Principal | None:
        """None when the token is missing or unknown (and anonymous access is off). May ask the store."""
        if not token:
            return self.anonymous
        known, principal = self.known(token)
        if known:
            return principal
        record = self._stored(hash_token(token))
        return None if record is None else Principal(record.name, record.role)

    def known(self, token: str) -> tuple[bool, Principal | None]:
        """What is known without asking the store: (True, principal or None) or (False, None)."""
        digest = hash_token(token)
        for t in self.configured:
            if hmac.compare_digest(t.sha256, digest):
                return True, Principal(t.name, t.role)
        with self._lock:
            hit = self._cache.get(digest)
        if hit is not None and hit[0] > time.monotonic():
            return True, None if hit[1] is None else Principal(hit[1].name, hit[1].role)
        return False, None

    def _stored(self, digest: str) -> TokenRecord | None:
        now = time.monotonic()
        record = self.store.find_token(digest)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (now + self.cache_s, record)
        return record

    def forget(self) -> None:
        """Drop cached look-ups (after a token is made or revoked through this replica)."""
        with self._lock:
            self._cache.clear()
