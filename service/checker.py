"""Compile requests checked outside the API process.

Parsing a request (pydantic over up to FXCC_MAX_REQUEST_BYTES of JSON), the op check, the key and
the FakeTensor shape propagation cost seconds for a large graph, and pydantic holds the GIL for the
whole parse: done in the API process, one large request would stall every other answer, the health
check's included. So a pool of warm checker processes (service/subproc.py) does all of it, each
request under a wall-clock and a memory limit (FXCC_CHECK_TIMEOUT_S, FXCC_CHECK_MEMORY_MB), and the
API process only moves bytes: the raw body goes to a checker, which answers with the request's key,
its priority and its normalized JSON, or with the 422 to send.

Identical bodies are checked once: a body being checked is waited on by every request that sends
the same bytes (a thousand ranks asking for the same graph), and a body checked lately is known by
its digest. A principal may have FXCC_CHECK_PER_PRINCIPAL distinct bodies in the checkers at once;
one more is a 429 for it alone.

    python -m fxcc.service.checker FD PARENT_PID     (started by the pool, never by hand)
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fxcc.compiler_core.errors import FxccError, InvalidGraph
from fxcc.service import subproc

log = logging.getLogger("fxcc.service")

KNOWN_BODIES = 1024  # digests of bodies checked lately (32 bytes each, plus the key)


class CheckRejected(FxccError):
    """A checker answered that the request is bad: `body` is the 4xx's JSON, `http_status` its status."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(str(body.get("message", "invalid request")))
        self.http_status = status
        self.body = body

    def to_dict(self) -> dict[str, Any]:
        return self.body


class TooCostly(FxccError):
    """Checking the request ran past its time or memory limit: the graph is too costly to accept."""

    kind = "invalid"


class ChecksBusy(FxccError):
    """The principal has FXCC_CHECK_PER_PRINCIPAL requests being checked already."""

    kind = "quota"
    quota = "FXCC_CHECK_PER_PRINCIPAL"


class CheckerUnavailable(FxccError):
    """No checker process could answer (it crashed, or could not start)."""

    kind = "unavailable"


@dataclass(frozen=True)
class Checked:
    """A request that passed every check: its key, priority and the JSON to queue (normalized by
    the checker; None when the body is known from an earlier check, when the body itself is queued)."""

    key: str
    priority: str
    request_json: bytes | None


@dataclass(frozen=True)
class CheckLimits:
    processes: int = 2
    timeout_s: float = 60.0
    memory_mb: int = 4096
    per_principal: int = 4
    max_nodes: int = 20_000


class CheckerPool:
    """`processes` warm checker processes shared by every request of the API process."""

    def __init__(self, limits: CheckLimits) -> None:
        self.limits = limits
        self._idle: queue.Queue[subproc.WarmProcess] = queue.Queue()
        self._procs = [subproc.WarmProcess("fxcc.service.checker", "request checker", outlive_thread=True)
                       for _ in range(limits.processes)]
        for p in self._procs:
            self._idle.put(p)
        self._lock = threading.Lock()
        self._inflight: dict[bytes, Future[Checked]] = {}
        self._known: OrderedDict[bytes, tuple[str, str]] = OrderedDict()
        self._per_principal: dict[str, int] = {}
        self.checked = 0  # bodies a checker parsed (for tests and /metrics)

    def start(self) -> None:
        """Start the processes now (they import torch in the background) rather than at the first request."""
        for p in self._procs:
            if p.pid is None:
                p.start()

    def close(self) -> None:
        for p in self._procs:
            p.close()

    def check(self, body: bytes, principal: str) -> Checked:
        """`body`'s key and normalized JSON, checked by a checker process. Raises CheckRejected (the
        4xx a checker answered), TooCostly, ChecksBusy or CheckerUnavailable. Blocking: call it
        from a thread."""
        digest = hashlib.sha256(body).digest()
        with self._lock:
            known = self._known.get(digest)
            if known is not None:
                self._known.move_to_end(digest)
                return Checked(known[0], known[1], None)
            waiting = self._inflight.get(digest)
            if waiting is None:
                if self._per_principal.get(principal, 0) >= self.limits.per_principal:
                    raise ChecksBusy(f"principal {principal!r} has {self.limits.per_principal} requests being "
                                     "checked already (FXCC_CHECK_PER_PRINCIPAL); retry later")
                self._per_principal[principal] = self._per_principal.get(principal, 0) + 1
                mine: Future[Checked] = Future()
                self._inflight[digest] = mine
        if waiting is not None:  # the same bytes are being checked for someone: their answer is ours
            got = waiting.result()
            return Checked(got.key, got.priority, None)
        try:
            result = self._run(body)
            with self._lock:
                self._known[digest] = (result.key, result.priority)
                while len(self._known) > KNOWN_BODIES:
                    self._known.popitem(last=False)
            mine.set_result(result)
            return result
        except BaseException as e:
            mine.set_exception(e)
            raise
        finally:
            with self._lock:
                del self._inflight[digest]
                left = self._per_principal[principal] - 1
                if left:
                    self._per_principal[principal] = left
                else:
                    del self._per_principal[principal]

    def _run(self, body: bytes) -> Checked:
        with self._process() as proc:
            try:
                header, frames = proc.call(
                    {"type": "check", "max_nodes": self.limits.max_nodes}, [body],
                    timeout_s=self.limits.timeout_s, memory_mb=self.limits.memory_mb,
                    limits_named=("FXCC_CHECK_TIMEOUT_S", "FXCC_CHECK_MEMORY_MB"))
            except (subproc.OverTime, subproc.OverMemory) as e:
                raise TooCostly(f"checking the request was stopped: {e.message}. The graph is too costly "
                                "to accept; split it or raise the limit") from None
            except subproc.HelperCrashed as e:
                raise CheckerUnavailable(e.message) from None
        self.checked += 1
        if header.get("type") == "ok":
            return Checked(str(header["key"]), str(header["priority"]), frames[0])
        if header.get("type") == "rejected" and 400 <= int(header.get("status", 0)) < 500:
            raise CheckRejected(int(header["status"]), dict(header["body"]))
        raise CheckerUnavailable(f"the request checker answered {str(header)[:200]}")

    @contextmanager
    def _process(self) -> Iterator[subproc.WarmProcess]:
        proc = self._idle.get()
        try:
            yield proc
        finally:
            self._idle.put(proc)


_pools: dict[CheckLimits, CheckerPool] = {}
_pools_lock = threading.Lock()


def pool_for(limits: CheckLimits) -> CheckerPool:
    """The API process's pool for `limits`: one per process (apps of the same settings share it),
    closed at exit."""
    with _pools_lock:
        pool = _pools.get(limits)
        if pool is None:
            pool = _pools[limits] = CheckerPool(limits)
        return pool


@atexit.register
def _close_pools() -> None:
    for pool in list(_pools.values()):
        pool.close()


# ---------------------------------------------------------------- the checker process


def main() -> None:
    """The checker process: import the compiler once, then check one request at a time."""
    conn = subproc.child_connection()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s %(name)s [request checker {os.getpid()}]: %(message)s")
    _warm_up()  # torch and the compiler imported, shape propagation run once: seconds, before "ready"
    subproc.freeze_heap()  # what the imports and the warm-up left lives as long as the process
    subproc.say_ready(conn)
    while True:
        try:
            header, frames = subproc.receive(conn)
        except EOFError:
            return
        if header.get("type") != "check":
            return
        answer, out = check_body(frames[0], int(header["max_nodes"]))
        subproc.send(conn, answer, out)


def _warm_up() -> None:
    body = (b'{"graph":{"placeholders":[{"name":"x","spec":{"dtype":"float32","sizes":[2],"strides":[1]}}],'
            b'"nodes":[{"name":"y","target":"aten.sin.default","args":[{"kind":"node","name":"x"}]}],'
            b'"outputs":[{"kind":"node","name":"y"}]}}')
    answer, _ = check_body(body, 1)
    if answer["type"] != "ok":
        log.warning("the warm-up check failed: %s", answer)


def check_body(body: bytes, max_nodes: int) -> tuple[dict[str, Any], list[bytes]]:
    """What a checker answers for `body`: ok with the key, priority and normalized JSON, or the
    rejection to send (a ValidationError's 422 in the shape handlers.py gives it, or an
    FxccError's own status)."""
    from pydantic import ValidationError

    from fxcc.compiler_core.keys import compile_key
    from fxcc.compiler_core.wire import CompileRequest
    from fxcc.service.handlers import http_status, validation_body

    try:
        request = CompileRequest.model_validate_json(body)
        check_graph(request.graph, max_nodes)
        key = compile_key(request)
        propagate_shapes(request.graph)  # shapes must fit together before a worker spends time on it
    except ValidationError as e:
        return {"type": "rejected", "status": 422, "body": validation_body(e.errors(include_input=False))}, []
    except FxccError as e:
        status = http_status(e)
        status = status if 400 <= status < 500 else 422
        return {"type": "rejected", "status": status, "body": e.to_dict()}, []
    except Exception as e:
        log.warning("a request could not be checked", exc_info=True)
        error = InvalidGraph(f"the request could not be checked: {type(e).__name__}: {str(e)[:300]}")
        return {"type": "rejected", "status": 422, "body": error.to_dict()}, []
    return {"type": "ok", "key": key, "priority": request.priority}, [request.model_dump_json().encode()]


def check_graph(graph: Any, max_nodes: int) -> None:
    """Cheap checks first: the node limit, then that every target names an allowed op."""
    from fxcc.compiler_core.wire import resolve_target

    if len(graph.nodes) > max_nodes:
        raise InvalidGraph(f"graph has {len(graph.nodes)} nodes, over the limit of {max_nodes} (FXCC_MAX_NODES)")
    for node in graph.nodes:
        if node.control is not None:
            for sub in node.control.graphs:
                check_graph(sub, max_nodes)
        elif node.flex is not None:  # its target was checked as data; its mods are graphs of aten ops
            for sub in (node.flex.score_mod, node.flex.mask_mod, node.flex.joint):
                if sub is not None:
                    check_graph(sub, max_nodes)
        elif node.opaque is None and node.triton is None:  # those were checked as data when they parsed
            resolve_target(node.target, node=node.name)  # InvalidGraph → 422 naming node and op


def propagate_shapes(graph: Any) -> None:
    """rebuild_graph's shape propagation (without its FX graph: compiler_core.graph.propagate_shapes),
    with whatever torch raises on nonsense arguments reported as InvalidGraph."""
    from fxcc.compiler_core.graph import propagate_shapes as propagate

    try:
        propagate(graph)
    except FxccError:
        raise
    except Exception as e:  # noqa: BLE001 - torch's errors for bad args are many; all mean "bad graph"
        raise InvalidGraph(f"shape propagation failed: {type(e).__name__}: {str(e)[:500]}") from None


if __name__ == "__main__":
    main()
