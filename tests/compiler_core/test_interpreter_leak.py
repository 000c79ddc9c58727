"""An interpreted launch leaves Triton's language builtins as it found them.

A later cross-compile in the same process reads them: with Triton 3.9, the helper calls inside an
interpreted reduction left 64 builtins of triton.language.core patched, and a cross-compile after
them failed on `tl.program_id` ("'value' object has no attribute 'dtype'") depending on test order.
compiler_core.triton_lock.repair_interpreter makes helper calls restore what they patch.
"""

from __future__ import annotations

import torch
import triton.language as tl

from tests.compiler_core.helpers import check


def _changed(before: dict[str, dict[str, object]]) -> list[str]:
    return [f"{name}.{attr}" for name, module in (("core", tl.core), ("language", tl), ("math", tl.math))
            for attr, value in before[name].items() if vars(module).get(attr) is not value]


def test_an_interpreted_reduction_leaves_the_language_builtins_unpatched():
    before = {"core": dict(vars(tl.core)), "language": dict(vars(tl)), "math": dict(vars(tl.math))}
    x = torch.randn(8, 33)
    check(lambda t: (t.sin().sum(1), t.amax(1), torch.softmax(t, 1)), x, atol=1e-5, rtol=1e-5)
    assert _changed(before) == []
