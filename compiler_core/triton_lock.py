"""One process-wide lock around everything that touches Triton's global language state.

Note: Triton's CPU interpreter patches the builtins of `triton.language` module-wide for the
length of each interpreted launch, and the cross-compiler reads the same builtins (and the global
`interpret` knob) while it compiles. A background compile (a non-blocking client, the embedded
worker) running beside an interpreted launch would see the other's patched builtins: compile
errors ("'value' object has no attribute 'dtype'") or kernels that run with the wrong semantics.
So interpreted launches, kernel-module imports and cross-compiles take this lock; cubin launches
on a GPU touch no such state and never take it.
"""

from __future__ import annotations

import os
import threading

TRITON_LOCK = threading.RLock()


_repaired: list[bool] = []


def repair_interpreter() -> None:
    """Make Triton's interpreter undo what a device-function call patches (once per process).

    Note: an interpreted launch patches triton.language's builtins and restores them when it ends;
    but in Triton 3.9 a call of an interpreted @jit helper inside it (tl.sum's combine, a kernel
    module's own helpers) patches the modules its own globals see (triton.language.core for the
    library's helpers, which the launch did not patch) and never restores them. After one such
    launch, 64 builtins of triton.language.core stayed patched, and a later cross-compile in the
    process read them ("'value' object has no attribute 'dtype'" at tl.program_id). Here the
    helper call restores its own patches when it returns, as a launch does (values the launch had
    patched go back to the launch's). Tritons whose interpreter has no patch scope are left alone.
    """
    with TRITON_LOCK:
        if _repaired:
            return
        _repaired.append(True)
        try:
            from triton.runtime import interpreter
        except ImportError:
            return
        cls = getattr(interpreter, "InterpretedFunction", None)
        patch = getattr(interpreter, "_patch_lang", None)
        error = getattr(interpreter, "InterpreterError", None)
        if cls is None or patch is None or error is None or not hasattr(interpreter, "_LangPatchScope"):
            return

        def call(self, *args, **kwargs):  # Triton's InterpretedFunction.__call__, restoring
            scope = patch(self.fn)
            fn = self.rewrite()
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                raise error(repr(e)) from e
            finally:
                if scope is not None:
                    scope.restore()

        cls.__call__ = call


if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter will run here: repair it first
    repair_interpreter()
