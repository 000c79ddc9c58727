"""A worker's build process: a warm helper process (service/subproc.py: `python -m fxcc.worker.builder`)
that builds one kernel at a time (compiler_core.build.build_kernel), under a wall-clock and a memory
limit, killed (then replaced) when it runs past either.

A task goes there as its BuildTask JSON; the BuiltKernel comes back encoded in one frame, and the
parent re-validates both ends.
"""

from __future__ import annotations

import logging
import os
import time
from multiprocessing.connection import Connection
from typing import Any

from fxcc.compiler_core.build_tasks import BuildTask, BuiltKernel
from fxcc.service.subproc import WarmProcess, answer_requests, child_connection, freeze_heap, send

log = logging.getLogger("fxcc.worker")


# A copy kernel, cross-compiled once when a build process starts (Triton's and ptxas's first use).
WARM_UP = BuildTask(name="fxcc_warm_up", arch=90, num_warps=1, num_stages=1, constexprs={"XBLOCK": 128},
                    types=("*fp32", "*fp32", "i32"), divisible16=(0, 1), triton="", source="""\
import triton
import triton.language as tl


@triton.jit
def fxcc_warm_up(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xmask), xmask)
""")


def main() -> None:
    """`python -m fxcc.worker.builder FD PARENT_PID`: the build process on socket FD."""
    builder_main(child_connection())


def builder_main(conn: Connection) -> None:
    """Import Triton and its CUDA backend once, then build one task at a time until told to stop."""
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s %(name)s [build process {os.getpid()}]: %(message)s")
    from fxcc.compiler_core.build import build_kernel, cuda_build_unavailable  # triton: a second or two

    if cuda_build_unavailable() is None:
        import triton

        build_kernel(WARM_UP.model_copy(update={"triton": triton.__version__}))  # first-use costs: ~1 s
    freeze_heap()  # Triton's and the compiler's imports live as long as the process (service/subproc.py)
    answer_requests(conn, ("build",), lambda header, frames: send(conn, {"type": "done"}, [_build(header, frames)]))


def _build(header: dict[str, Any], frames: list[bytes]) -> bytes:
    """The encoded BuiltKernel of a build request; a bad task is the task's outcome."""
    from fxcc.compiler_core.build import build_kernel

    try:
        task = BuildTask.model_validate_json(frames[0])
        if header.get("delay_s"):
            time.sleep(float(header["delay_s"]))
        built = build_kernel(task)
    except Exception as e:  # noqa: BLE001
        built = BuiltKernel(error=f"{type(e).__name__}: {e}"[:400])
    return built.encode()


class BuildProcess(WarmProcess):
    """One build consumer's warm build process. `build` raises service.subproc's OverTime,
    OverMemory or HelperCrashed; a Triton error is a BuiltKernel with `error` set."""

    def __init__(self, name: str) -> None:
        super().__init__("fxcc.worker.builder", "build process", logger=log)
        self.consumer = name

    def build(self, task: BuildTask, *, timeout_s: float, memory_mb: float, delay_s: float = 0.0) -> BuiltKernel:
        header, frames = self.call({"type": "build", "delay_s": delay_s}, [task.model_dump_json().encode()],
                                   timeout_s=timeout_s, memory_mb=memory_mb,
                                   limits_named=("FXCC_BUILD_TIMEOUT_S", "FXCC_BUILD_MEMORY_MB"))
        if header.get("type") != "done" or len(frames) != 1:
            raise ValueError(f"the build process answered {header.get('type')!r}")
        return BuiltKernel.decode(frames[0])


if __name__ == "__main__":
    main()
