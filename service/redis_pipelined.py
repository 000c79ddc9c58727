"""A small asyncio Redis client for the cache-hit path: EVALSHA, GET and counters, every concurrent
request of an API process pipelined on a few connections.

Note: redis-py's asyncio client took 45% of a cache hit's time (a pooled connection per request,
retries, per-command timeouts; bench/README.md, issue 24). Here a request writes its command on
the next connection of a small ring and awaits its reply in order (Redis answers a connection's
commands in the order sent), so 64 concurrent hits are a few writes and reads. Replies are parsed
by the RESP2 reader below; nothing in them is interpreted. Only `redis://` URLs (host, port,
user, password, database); the cache falls back to redis-py for any other (TLS, unix sockets).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any
from urllib.parse import unquote, urlsplit

import redis

RESPONSE_TIMEOUT_S = 10.0  # a connection whose oldest command waits longer is dropped (503s)
CONNECT_TIMEOUT_S = 5.0


class Incomplete(Exception):
    """The buffer ends inside a reply."""


def supports(url: str) -> bool:
    return urlsplit(url).scheme == "redis"


def parse_reply(buf: bytes | bytearray, pos: int) -> tuple[Any, int]:
    """One RESP2 reply from buf[pos:]: (value, position after it). An error reply is returned as a
    redis.ResponseError (not raised). Raises Incomplete when the reply is not all there yet."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind, line = buf[pos:pos + 1], buf[pos + 1:end]
    pos = end + 2
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise Incomplete
        return bytes(buf[pos:pos + n]), pos + n + 2
    if kind == b"*":
        n = int(line)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = parse_reply(buf, pos)
            items.append(item)
        return items, pos
    if kind == b":":
        return int(line), pos
    if kind == b"+":
        return bytes(line), pos
    if kind == b"-":
        text = bytes(line).decode(errors="replace")
        cls = redis.exceptions.NoScriptError if text.startswith("NOSCRIPT") else redis.ResponseError
        return cls(text), pos
    raise redis.ConnectionError(f"unexpected reply from Redis: {bytes(buf[pos - len(line) - 3:end])[:80]!r}")


def pack(*args: bytes | str | int) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


class _Connection(asyncio.Protocol):
    """One connection: commands written in order, their futures resolved in the same order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[tuple[asyncio.Future, float]] = collections.deque()
        self.buf = bytearray()
        self.closed = False
        self.out: list[bytes] = []  # commands of this event-loop iteration, written together

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, data: bytes, count: int, deadline: float) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(count)]
        self.pending.extend((f, deadline) for f in futures)
        if not self.out:
            loop.call_soon(self._flush)
        self.out.append(data)
        return futures

    def _flush(self) -> None:
        """One write (one system call) for every hit that sent a command since the last one."""
        data, self.out = b"".join(self.out), []
        if not self.closed:
            self.transport.write(data)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        pos = 0
        try:
            while self.pending:
                value, pos = parse_reply(self.buf, pos)
                future, _ = self.pending.popleft()
                if not future.done():
                    future.set_result(value)
        except Incomplete:
            pass
        except Exception as e:  # noqa: BLE001 - a garbled stream: nothing more on it can be trusted
            self.fail(redis.ConnectionError(f"bad reply from Redis: {e}"))
            return
        del self.buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(redis.ConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def fail(self, exc: Exception) -> None:
        self.closed = True
        while self.pending:
            future, _ = self.pending.popleft()
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def overdue(self, now: float) -> bool:
        return bool(self.pending) and self.pending[0][1] < now


class PipelinedRedis:
    """EVALSHA against the Redis at `url`, over `connections` connections per event loop's process."""

    def __init__(self, url: str, connections: int = 2, timeout_s: float = RESPONSE_TIMEOUT_S) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 6379
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self.db = int(parts.path.strip("/") or 0)
        self.timeout_s = timeout_s
        self._ring: list[_Connection | None] = [None] * connections
        self._next = 0
        self._connecting: dict[int, asyncio.Task] = {}
        self._watchdog: asyncio.TimerHandle | None = None

    async def evalsha_many(self, sha: str, script: str, calls: list[tuple[list[str], list[str]]]) -> list[Any]:
        """The replies of EVALSHA sha for each (keys, args), written at once on one connection.
        A script Redis does not know (a restart, SCRIPT FLUSH) is loaded and the calls sent again."""
        data = b"".join(pack("EVALSHA", sha, len(keys), *keys, *args) for keys, args in calls)
        replies = await self._send(data, len(calls))
        if any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
            loaded = (await self._send(pack("SCRIPT", "LOAD", script), 1))[0]
            _raise_error(loaded)
            replies = await self._send(data, len(calls))
        for r in replies:
            _raise_error(r)
        return replies

    async def execute(self, *commands: tuple[bytes | str | int, ...]) -> list[Any]:
        """The replies of `commands` (each a command and its arguments), written at once on one
        connection; an error reply raises."""
        replies = await self._send(b"".join(pack(*c) for c in commands), len(commands))
        for r in replies:
            _raise_error(r)
        return replies

    def send_only(self, *command: bytes | str | int) -> None:
        """`command` written with the next round's commands, its reply read and dropped (a counter:
        nobody waits on it). Skipped while the connection it would take is not open."""
        i = self._next = (self._next + 1) % len(self._ring)
        conn = self._ring[i]
        if conn is not None and not conn.closed:
            for future in conn.send(pack(*command), 1, time.monotonic() + self.timeout_s):
                future.add_done_callback(_dropped)

    async def _send(self, data: bytes, count: int) -> list[Any]:
        i = self._next = (self._next + 1) % len(self._ring)
        conn = self._ring[i]
        if conn is None or conn.closed:
            conn = await self._connect(i)
        futures = conn.send(data, count, time.monotonic() + self.timeout_s)
        return [await futures[0]] if count == 1 else await asyncio.gather(*futures)

    async def _connect(self, i: int) -> _Connection:
        """The connection in slot i, made once however many requests wait for it."""
        task = self._connecting.get(i)
        if task is None:
            task = self._connecting[i] = asyncio.ensure_future(self._open())
            task.add_done_callback(lambda _: self._connecting.pop(i, None))
        conn = await asyncio.shield(task)
        self._ring[i] = conn
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().call_later(1.0, self._check)
        return conn

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(_Connection, self.host, self.port),
                                             CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError) as e:
            raise redis.ConnectionError(f"cannot connect to Redis at {self.host}:{self.port}: {e}") from None
        setup = []
        if self.password is not None:
            setup.append(pack("AUTH", *([self.username] if self.username else []), self.password))
        if self.db:
            setup.append(pack("SELECT", self.db))
        if setup:
            for reply in await asyncio.gather(*conn.send(b"".join(setup), len(setup), time.monotonic() + self.timeout_s)):
                if isinstance(reply, Exception):
                    conn.fail(reply)
                    raise redis.ConnectionError(f"Redis refused the connection's setup: {reply}")
        return conn

    def _check(self) -> None:
        """Drop connections whose oldest command is overdue (their requests get a 503)."""
        now = time.monotonic()
        for conn in self._ring:
            if conn is not None and not conn.closed and conn.overdue(now):
                conn.fail(redis.TimeoutError(f"Redis did not answer within {self.timeout_s:.0f} s"))
        self._watchdog = asyncio.get_running_loop().call_later(1.0, self._check)

    async def aclose(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for conn in self._ring:
            if conn is not None and conn.transport is not None:
                conn.closed = True
                conn.transport.close()
        self._ring = [None] * len(self._ring)


def _dropped(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # retrieved, so that asyncio does not log it as never retrieved


def _raise_error(reply: Any) -> None:
    if isinstance(reply, Exception):
        raise reply
