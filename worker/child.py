"""The worker's compile process: one per consumer, a fresh interpreter (`python -m fxcc.worker.child`,
never a fork of the threaded worker), kept warm across jobs, and killed (then replaced) when a
compile runs past its time or memory limit or its job is cancelled.

Note: multiprocessing's `spawn` would re-import the worker's main module in the child (a user's
unguarded script that starts an embedded service would start again there), so the process is a
plain subprocess talking over a socket pair. Nothing is pickled across it. A job goes to the child as a JSON header plus the
request's JSON text; the artifact comes back as its manifest JSON and one frame per blob; an
error as the JobError the child recorded. The parent re-validates all of it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from fxcc.compiler_core.artifact import Artifact, manifest_from_json
from fxcc.service.store import JobError, JobStage, Store
from fxcc.worker.limits import (
    CompileCrashed,
    CompileFailed,
    CompileMemoryLimit,
    CompileTimeout,
    JobCancelled,
    JobLimits,
    is_final,
)

if TYPE_CHECKING:
    from fxcc.worker.steps import CompileWork, StageCallback

log = logging.getLogger("fxcc.worker")

STARTUP_TIMEOUT_S = 300.0  # importing torch and triton on a loaded machine
WATCH_S = 0.1  # how often the parent samples the child's memory
CANCEL_POLL_S = 1.0  # how often it reads the job's record for a cancellation
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


# ---------------------------------------------------------------- the child


def main() -> None:
    """`python -m fxcc.worker.child FD PARENT_PID`: the compile process on socket FD."""
    child_main(Connection(int(sys.argv[1])), int(sys.argv[2]))


def child_main(conn: Connection, parent_pid: int) -> None:
    """The compile process: import the compiler once, then compile one job at a time until told
    to stop or the pipe closes."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C on the terminal is the worker's to handle
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s %(name)s [compile process {os.getpid()}]: %(message)s")
    from fxcc.worker.steps import CompileWork, compile_steps, warm_up  # torch and triton: seconds

    try:
        warm_up()
    except Exception:  # the jobs will say what is wrong
        log.warning("the warm-up compile failed", exc_info=True)
    send(conn, {"type": "ready"})
    while True:
        try:
            header, frames = receive(conn)
        except EOFError:
            return
        if header.get("type") != "compile":
            return
        work = CompileWork.from_header(header, frames[0].decode())
        try:
            artifact = compile_steps(work, lambda stage: send(conn, {"type": "stage", "stage": stage.value}))
        except Exception as e:  # any crash of the compiler is the job's outcome
            if not is_final(e):
                log.warning("compile failed", exc_info=True)
            send(conn, {"type": "error", "error": JobError.of(e).model_dump(), "final": is_final(e)})
            continue
        digests = list(artifact.blobs)
        send(conn, {"type": "done", "blobs": digests},
             [artifact.manifest_json(), *(artifact.blobs[d] for d in digests)])


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process when the worker thread that started it goes (SIGKILL of
    the worker included), so that no compile outlives its worker."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it went before the line above
        os._exit(0)


# ---------------------------------------------------------------- the parent's handle


def rss_mb(pid: int) -> float | None:
    """Resident memory of process `pid` in MB (Linux /proc), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE / (1 << 20)
    except (OSError, ValueError, IndexError):
        return None


class CompileProcess:
    """One consumer's warm compile process. `compile` runs a job there under `limits` and watches it:
    memory every WATCH_S, the job's record every CANCEL_POLL_S. A process that is killed or dies is
    replaced at once, so that the next job finds a warm one."""

    def __init__(self, limits: JobLimits, name: str) -> None:
        self.limits = limits
        self.name = name
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._ready = False
        self.started = 0  # processes started so far (the first, and each replacement)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the process; it imports the compiler in the background until the first job."""
        ours, theirs = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "fxcc.worker.child", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._conn, self._ready = Connection(ours.detach()), False
        self.started += 1

    def close(self) -> None:
        """Stop the process: an idle one is asked (and killed if it does not go), one still
        importing the compiler is killed at once (it reads its pipe only when it is ready)."""
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

    def compile(self, work: CompileWork, *, job_id: str, store: Store, on_stage: StageCallback) -> Artifact:
        """`work`'s artifact, compiled in the process. Raises CompileTimeout or CompileMemoryLimit
        (over a limit), JobCancelled (the job's record says cancelled), CompileFailed (the compiler
        raised) or CompileCrashed (the process died)."""
        conn = self._await_ready(store, job_id)
        answered = False  # the process answered the job (done or error): it is idle and sound again
        try:
            try:
                send(conn, {"type": "compile", **work.header()}, [work.request_json.encode()])
            except (OSError, ValueError) as e:  # the pipe broke
                raise CompileCrashed(f"the compile process could not take the job: {e}") from None
            deadline = time.monotonic() + self.limits.timeout_s
            next_poll = time.monotonic() + CANCEL_POLL_S
            while True:
                if wait([conn], timeout=WATCH_S):  # a message, or the end of the pipe: the process is gone
                    try:
                        header, frames = receive(conn)
                    except (EOFError, OSError):
                        raise self._crash() from None
                    if header["type"] == "stage":
                        on_stage(JobStage(header["stage"]))
                        continue
                    answered = True
                    return self._outcome(header, frames)
                now = time.monotonic()
                used = rss_mb(self.pid or 0)
                if used is not None and used > self.limits.memory_mb:
                    raise CompileMemoryLimit(
                        f"the compile used {used:.0f} MB of resident memory, over the job limit of "
                        f"{self.limits.memory_mb} MB (FXCC_JOB_MEMORY_MB); it was stopped")
                if now >= deadline:
                    raise CompileTimeout(f"the compile ran past the job limit of {self.limits.timeout_s:g} s "
                                         "(FXCC_JOB_TIMEOUT_S); it was stopped")
                if now >= next_poll:
                    next_poll = now + CANCEL_POLL_S
                    if _cancelled(store, job_id):
                        raise JobCancelled(job_id)
        finally:
            # Note: whatever ended the wait (a limit, a cancellation, a store error in on_stage), a
            # process that did not answer may still be compiling this job: it is never reused.
            if not answered:
                self._replace()

    def _outcome(self, header: dict[str, Any], frames: list[bytes]) -> Artifact:
        if header["type"] == "error":
            raise CompileFailed(JobError.model_validate(header["error"]), bool(header["final"]))
        manifest = manifest_from_json(frames[0])
        artifact = Artifact(manifest, dict(zip(header["blobs"], frames[1:], strict=True)))
        artifact.verify()  # every blob present, with its digest
        return artifact

    def _await_ready(self, store: Store, job_id: str) -> Connection:
        """The pipe of a process that has imported the compiler (started now if there is none).
        Waiting for it is not counted against the job's time limit; a cancellation is heard."""
        if self._proc is None:
            try:
                self.start()
            except OSError as e:
                raise CompileCrashed(f"could not start a compile process: {e}") from None
        assert self._conn is not None and self._proc is not None
        t0 = time.monotonic()
        while not self._ready:
            try:
                if wait([self._conn], timeout=CANCEL_POLL_S):
                    if receive(self._conn)[0].get("type") != "ready":
                        break
                    self._ready = True
                    log.info("%s: compile process %d ready in %.1f s", self.name, self._proc.pid,
                             time.monotonic() - t0)
                elif time.monotonic() - t0 > STARTUP_TIMEOUT_S:
                    break
                elif _cancelled(store, job_id):
                    raise JobCancelled(job_id)  # the process warms up on for the next job
            except (EOFError, OSError):
                break
        if self._ready:
            return self._conn
        code = self._proc.poll()
        self._replace()
        raise CompileCrashed(f"the compile process did not start within {STARTUP_TIMEOUT_S:g} s "
                             f"(exit code {code})")

    def _crash(self) -> CompileCrashed:
        """The error for a process that went away by itself (replaced by the caller)."""
        assert self._proc is not None
        try:
            code: int | None = self._proc.wait(1)
        except subprocess.TimeoutExpired:
            code = None
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return CompileCrashed(f"the compile process died ({how}; the kernel's OOM killer, or a crash "
                              "in native code)")

    def _replace(self) -> None:
        """Kill the process and start a fresh one, which warms up while the next job is claimed
        (or, if it cannot be started now, when the next job comes)."""
        self._kill()
        try:
            self.start()
        except OSError as e:
            log.warning("%s: could not start a compile process (%s); trying again at the next job", self.name, e)

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(10)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn, self._ready = None, None, False


def _cancelled(store: Store, job_id: str) -> bool:
    """Whether the job's record says cancelled; a store error says no (the compile goes on)."""
    try:
        job = store.get_job(job_id)
    except Exception as e:  # noqa: BLE001 - Redis away for a moment: ask again in a second
        log.warning("job %s: could not read its record (%s: %s)", job_id, type(e).__name__, e)
        return False
    return job is not None and job.stage is JobStage.CANCELLED


if __name__ == "__main__":
    main()
