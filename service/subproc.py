"""Warm helper processes: a fresh interpreter (`python -m MODULE FD PARENT_PID`, never a fork of a
threaded server) that imports what it needs once and then answers one request at a time over a
socket pair, watched by its parent for wall clock and resident memory, and killed (then replaced)
when it runs past either.

The worker's compile processes (worker/child.py) and the API's request checkers
(service/checker.py) are both such processes.

Note: multiprocessing's `spawn` would re-import the parent's main module in the child (a user's
unguarded script that starts an embedded service would start again there), so the process is a
plain subprocess. Nothing is pickled across it: each message is a JSON header saying how many raw
frames follow, then the frames; the parent re-validates what comes back.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from typing import Any

from fxcc.compiler_core.errors import FxccError

log = logging.getLogger("fxcc.service")

STARTUP_TIMEOUT_S = 300.0  # importing torch and triton on a loaded machine
WATCH_S = 0.1  # how often the parent samples the child's memory
POLL_S = 1.0  # how often the parent asks its caller whether to give up (a cancellation)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# ---------------------------------------------------------------- the pipe's framing


def send(conn: Connection, header: dict[str, Any], frames: Sequence[bytes] = ()) -> None:
    """A JSON header saying how many raw frames follow, then the frames."""
    conn.send_bytes(json.dumps({**header, "frames": len(frames)}).encode())
    for frame in frames:
        conn.send_bytes(frame)


def receive(conn: Connection) -> tuple[dict[str, Any], list[bytes]]:
    header = json.loads(conn.recv_bytes())
    frames = [conn.recv_bytes() for _ in range(int(header.pop("frames", 0)))]
    return header, frames


# ---------------------------------------------------------------- the child's side


def child_connection() -> Connection:
    """In `python -m MODULE FD PARENT_PID`: the pipe to the parent, after arranging to die with
    it and to leave Ctrl-C on the terminal to the parent."""
    die_with_parent(int(sys.argv[2]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return Connection(int(sys.argv[1]))


def freeze_heap() -> int:
    """In the child, once its imports and warm-up are done: move every object alive now into the
    garbage collector's permanent generation, which its collections never walk. Returns how many.

    Note: torch, sympy, triton and the compiler leave about 300k long-lived objects, which the
    collector's full collections during a job walked again and again (bench/README.md, "Frozen
    heap"). Objects made later, a job's garbage included, are collected as before; what is frozen
    lives as long as the process anyway. Collected first, so that the warm-up's garbage is not
    kept; unfrozen at exit, so that the interpreter's last collection still finalizes it (else
    triton's bindings report their objects as leaked on every stop).
    """
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
    return gc.get_freeze_count()


def say_ready(conn: Connection) -> None:
    """Tell the parent this child is warm (with how many objects it froze, for its log)."""
    send(conn, {"type": "ready", "frozen_objects": gc.get_freeze_count()})


def answer_requests(conn: Connection, kinds: tuple[str, ...],
                    answer: Callable[[dict[str, Any], list[bytes]], None]) -> None:
    """In the child, once it is warm: say ready, then hand each request of one of `kinds` to
    `answer` (which sends the reply) until the pipe closes or another kind (a stop) comes."""
    say_ready(conn)
    while True:
        try:
            header, frames = receive(conn)
        except EOFError:
            return
        if header.get("type") not in kinds:
            return
        answer(header, frames)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process when the thread that started it goes (SIGKILL of the
    parent included), so that no helper outlives its parent."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it went before the line above
        os._exit(0)


def rss_mb(pid: int) -> float | None:
    """Resident memory of process `pid` in MB (Linux /proc), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE / (1 << 20)
    except (OSError, ValueError, IndexError):
        return None


# ---------------------------------------------------------------- the parent's handle


class OverTime(FxccError):
    """The helper ran past its wall-clock limit and was killed."""


class OverMemory(FxccError):
    """The helper went over its resident-memory limit and was killed."""


class HelperCrashed(FxccError):
    """The helper died (a signal, the kernel's OOM killer, a crash in native code) or never started."""


class GaveUp(Exception):
    """The caller's `give_up` said to stop waiting (a cancellation); the helper was replaced."""


class WarmProcess:
    """One warm helper process running `python -m module`. `call` sends it a request and waits for
    the answer under a wall-clock and a memory limit. A process that is killed, dies, or did not
    answer its request is replaced at once, never reused, so that a late answer cannot become the
    next request's."""

    def __init__(self, module: str, name: str, *, outlive_thread: bool = False,
                 logger: logging.Logger = log) -> None:
        self.module = module
        self.name = name
        self.log = logger
        # The kernel kills the process when the *thread* that started it ends (die_with_parent):
        # a process shared by short-lived threads (a server's threadpool) is started from one
        # thread that lives as long as the interpreter.
        self.outlive_thread = outlive_thread
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._ready = False
        self._listening = threading.Lock()  # held while someone reads the "ready" message
        self.started = 0  # processes started so far (the first, and each replacement)
        self.frozen_objects: int | None = None  # what the process said it froze (freeze_heap) when ready

    @property
    def ready(self) -> bool:
        """Whether the process has said it is ready: heard by await_ready, or here without waiting
        (for heartbeats, from another thread; never while await_ready listens)."""
        if self._ready or self._conn is None or not self._listening.acquire(blocking=False):
            return self._ready
        try:
            conn = self._conn
            if not self._ready and conn is not None and conn.poll(0):
                self._ready = self._heard_ready(receive(conn)[0])
        except (EOFError, OSError, ValueError):
            pass  # gone: the next request finds out and replaces it
        finally:
            self._listening.release()
        return self._ready

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the process; it imports what it needs in the background until the first request."""
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-m", self.module, str(theirs.fileno()), str(os.getpid())]
        try:
            if self.outlive_thread:
                self._proc = _spawner().popen(argv, theirs.fileno())
            else:
                self._proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._conn, self._ready = Connection(ours.detach()), False
        self.frozen_objects = None
        self.started += 1

    def close(self) -> None:
        """Stop the process: an idle one is asked (and killed if it does not go), one still
        starting is killed at once (it reads its pipe only when it is ready)."""
        if self._proc is None:
            return
        if self._ready:
            try:
                assert self._conn is not None
                send(self._conn, {"type": "stop"})
                self._proc.wait(5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def call(self, header: dict[str, Any], frames: Sequence[bytes], *, timeout_s: float, memory_mb: float,
             limits_named: tuple[str, str], on_message: Callable[[dict[str, Any]], bool] | None = None,
             give_up: Callable[[], bool] | None = None) -> tuple[dict[str, Any], list[bytes]]:
        """Send a request and return the answer. `on_message` sees each message first and returns
        True for an interim one (a progress report) to wait on; `give_up` is asked every POLL_S.
        Raises OverTime or OverMemory (naming the settings in `limits_named`), HelperCrashed, or
        GaveUp. Waiting for the process to start is not counted against `timeout_s`."""
        conn = self.await_ready(give_up)
        answered = False
        try:
            try:
                send(conn, header, frames)
            except (OSError, ValueError) as e:  # the pipe broke
                raise HelperCrashed(f"the {self.name} could not take the request: {e}") from None
            deadline = time.monotonic() + timeout_s
            next_poll = time.monotonic() + POLL_S
            while True:
                if wait([conn], timeout=WATCH_S):  # a message, or the end of the pipe: the process is gone
                    try:
                        got, got_frames = receive(conn)
                    except (EOFError, OSError):
                        raise self._crash() from None
                    if on_message is not None and on_message(got):
                        continue
                    answered = True
                    return got, got_frames
                now = time.monotonic()
                used = rss_mb(self.pid or 0)
                if used is not None and used > memory_mb:
                    raise OverMemory(f"the {self.name} used {used:.0f} MB of resident memory, over the limit of "
                                     f"{memory_mb:g} MB ({limits_named[1]}); it was stopped")
                if now >= deadline:
                    raise OverTime(f"the {self.name} ran past the limit of {timeout_s:g} s ({limits_named[0]}); "
                                   "it was stopped")
                if give_up is not None and now >= next_poll:
                    next_poll = now + POLL_S
                    if give_up():
                        raise GaveUp()
        finally:
            # Note: whatever ended the wait, a process that did not answer may still be working on
            # this request: it is never reused.
            if not answered:
                self.replace()

    def await_ready(self, give_up: Callable[[], bool] | None = None) -> Connection:
        """The pipe of a process that is ready (started now if there is none). A `give_up` is heard
        meanwhile (the process warms up on for the next request)."""
        if self._proc is None:
            try:
                self.start()
            except OSError as e:
                raise HelperCrashed(f"could not start a {self.name}: {e}") from None
        assert self._conn is not None and self._proc is not None
        t0 = time.monotonic()
        with self._listening:
            while not self._ready:
                try:
                    if wait([self._conn], timeout=POLL_S):
                        if not self._heard_ready(receive(self._conn)[0]):
                            break
                        self._ready = True
                        self.log.info("%s %d ready in %.1f s (%s objects frozen)", self.name, self._proc.pid,
                                      time.monotonic() - t0, self.frozen_objects)
                    elif time.monotonic() - t0 > STARTUP_TIMEOUT_S:
                        break
                    elif give_up is not None and give_up():
                        raise GaveUp()
                except (EOFError, OSError):
                    break
        if self._ready:
            return self._conn
        code = self._proc.poll()
        self.replace()
        raise HelperCrashed(f"the {self.name} did not start within {STARTUP_TIMEOUT_S:g} s (exit code {code})")

    def _heard_ready(self, header: dict[str, Any]) -> bool:
        """Whether `header` is the process's ready message (and if so, note what it froze)."""
        if header.get("type") != "ready":
            return False
        self.frozen_objects = header.get("frozen_objects")
        return True

    def _crash(self) -> HelperCrashed:
        """The error for a process that went away by itself (replaced by the caller)."""
        assert self._proc is not None
        try:
            code: int | None = self._proc.wait(1)
        except subprocess.TimeoutExpired:
            code = None
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return HelperCrashed(f"the {self.name} died ({how}; the kernel's OOM killer, or a crash in native code)")

    def replace(self) -> None:
        """Kill the process and start a fresh one, which warms up while the next request comes
        (or, if it cannot be started now, when it comes)."""
        self._kill()
        try:
            self.start()
        except OSError as e:
            self.log.warning("could not start a %s (%s); trying again at the next request", self.name, e)

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(10)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn, self._ready = None, None, False


class _Spawner:
    """A daemon thread that starts processes for threads that come and go."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[list[str], int, Future[subprocess.Popen[bytes]]]] = queue.Queue()
        threading.Thread(target=self._run, name="fxcc-spawner", daemon=True).start()

    def popen(self, argv: list[str], fd: int) -> subprocess.Popen[bytes]:
        done: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((argv, fd, done))
        return done.result()

    def _run(self) -> None:
        while True:
            argv, fd, done = self._jobs.get()
            try:
                done.set_result(subprocess.Popen(argv, pass_fds=(fd,), stdin=subprocess.DEVNULL))
            except BaseException as e:  # noqa: BLE001 - the caller's to raise
                done.set_exception(e)


_the_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _spawner() -> _Spawner:
    global _the_spawner
    with _spawner_lock:
        if _the_spawner is None:
            _the_spawner = _Spawner()
        return _the_spawner
