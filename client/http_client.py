"""A plain-HTTP client on the standard library's http.client, for a warm start's requests to the service.

RemoteService talks to an `http://` service through this and to an `https://` one through httpx
(its TLS settings unchanged). It has the part of httpx's Client that RemoteService and its callers
use — `request`, `stream`, `close`, `timeout.read`; a response's `status_code`, `headers`, `content`,
`text`, `json()`, `raise_for_status()`, `read()`, `iter_lines()` — so that tests may still hand
RemoteService an httpx client of their own (an app's TestClient).

Note: httpx's Client makes httpcore's transport when it is created, and httpcore imports trio and
anyio when they are installed, for async clients that fxcc does not make: 0.25 s of a warm start on
a CPU host, and httpx itself (which imports its command line's click and rich when installed)
0.15 s more, both on the path from torch.compile to a package loaded from the service. http.client
is imported by torch already.

Note: connections are kept alive, one pool per client, taken by one request at a time (the client
is shared by threads: a package's PUT runs on fxcc's executor). A kept connection that the server
closed while idle fails on its next request before any answer: that request is sent once more on
a new connection, never one that got an answer.
"""

from __future__ import annotations

import http.client
import json as jsonlib
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

POOL_MAX = 8  # idle connections kept per client


class TransportError(Exception):
    """The service could not be reached, or the connection broke mid-answer."""


class HTTPStatusError(Exception):
    """raise_for_status on a 4xx or 5xx answer."""


class Timeout:
    """The client's timeouts, as httpx names the one RemoteService reads."""

    def __init__(self, seconds: float) -> None:
        self.connect = self.read = self.write = seconds


class Headers:
    """A response's headers, looked up without regard to case."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = {k.lower(): v for k, v in items}

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._items.get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items


class Response:
    """One answer; its body read at once (`request`) or as it arrives (`stream`)."""

    def __init__(self, client: Client, conn: http.client.HTTPConnection, raw: http.client.HTTPResponse,
                 method: str, url: str) -> None:
        self.status_code = raw.status
        self.headers = Headers(raw.getheaders())
        self.method, self.url = method, url
        self._client, self._conn, self._raw = client, conn, raw
        self._content: bytes | None = None

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise RuntimeError("a streamed response's body is read with read() or iter_lines()")
        return self._content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise HTTPStatusError(f"{self.status_code} for {self.method} {self.url}")

    def read(self) -> bytes:
        if self._content is None:
            try:
                self._content = self._raw.read()
            except (OSError, http.client.HTTPException) as e:
                self._drop()
                raise TransportError(f"{type(e).__name__}: {e}") from None
            self._release()
        return self._content

    def iter_lines(self) -> Iterator[str]:
        """The body's lines (without their line ends), as they arrive."""
        try:
            while True:
                line = self._raw.readline()
                if not line:
                    break
                yield line.rstrip(b"\r\n").decode()
        except (OSError, http.client.HTTPException) as e:
            self._drop()
            raise TransportError(f"{type(e).__name__}: {e}") from None
        self._content = b""
        self._release()

    def close(self) -> None:
        """Done with the answer: its connection back to the pool when the body was read whole."""
        if self._content is None:
            self._drop()

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._client._give_back(conn, reusable=not self._raw.will_close)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class Client:
    """Requests to one `http://host:port` service with fixed headers and a timeout."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain-HTTP service URL: {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.headers = {"User-Agent": "fxcc", **(headers or {})}
        self.timeout = Timeout(timeout)
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(self, method: str, path: str, **kw: Any) -> Response:
        r = self._send(method, path, **kw)
        r.read()
        return r

    @contextmanager
    def stream(self, method: str, path: str, **kw: Any) -> Iterator[Response]:
        r = self._send(method, path, **kw)
        try:
            yield r
        finally:
            r.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _send(self, method: str, path: str, *, json: Any = None, content: bytes | str | None = None,
              headers: dict[str, str] | None = None, params: dict[str, Any] | None = None,
              timeout: float | None = None) -> Response:
        url = self.prefix + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        sent = {**self.headers, **(headers or {})}
        body = content.encode() if isinstance(content, str) else content
        if json is not None:
            body = jsonlib.dumps(json).encode()
            sent.setdefault("Content-Type", "application/json")
        seconds = self.timeout.read if timeout is None else timeout
        for attempt in (0, 1):
            conn, reused = self._take(seconds, fresh=attempt == 1)
            try:
                conn.request(method, url, body=body, headers=sent)
                raw = conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                if reused and attempt == 0:  # closed by the server while it was idle: no answer came
                    continue
                raise TransportError(f"{type(e).__name__}: {e}") from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise TransportError(f"{type(e).__name__}: {e}") from None
            return Response(self, conn, raw, method, url)
        raise AssertionError("unreachable")

    def _take(self, timeout_s: float, fresh: bool) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            conn = self._idle.pop() if self._idle and not fresh else None
        if conn is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=timeout_s), False
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn, True

    def _give_back(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        with self._lock:
            if reusable and len(self._idle) < POOL_MAX:
                self._idle.append(conn)
                return
        conn.close()


__all__ = ["Client", "HTTPStatusError", "Response", "TransportError"]
