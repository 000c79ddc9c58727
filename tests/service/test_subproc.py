"""service/subproc.py's heap freeze: what a warm helper froze is reported to its parent (a real
request checker and a build process here; the compile process in tests/worker/test_compile_process.py), and garbage
made after the freeze is still collected."""

from __future__ import annotations

import gc
import weakref

from fxcc.service import subproc


def test_garbage_made_after_the_freeze_is_still_collected() -> None:
    class Cell:
        other: Cell

    try:
        frozen = subproc.freeze_heap()
        # frozen objects that lose their last reference are still freed (a pytest process's
        # threads drop a few between the two reads), so the count can only fall
        assert frozen > 0 and 0 < gc.get_freeze_count() <= frozen
        a, b = Cell(), Cell()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()  # this test process's heap goes back as it was


def test_a_checker_process_reports_its_frozen_heap_when_ready() -> None:
    proc = subproc.WarmProcess("fxcc.service.checker", "request checker")
    try:
        proc.await_ready()
        # torch and the compiler imported: far more than a bare interpreter's objects
        assert proc.frozen_objects is not None and proc.frozen_objects > 10_000
    finally:
        proc.close()


def test_a_build_process_reports_its_frozen_heap_when_ready() -> None:
    from fxcc.worker.builder import BuildProcess

    proc = BuildProcess("build process")
    try:
        proc.await_ready()
        assert proc.frozen_objects is not None and proc.frozen_objects > 10_000  # Triton and the compiler
    finally:
        proc.close()
