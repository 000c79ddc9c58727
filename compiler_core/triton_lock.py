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

import threading

TRITON_LOCK = threading.RLock()
