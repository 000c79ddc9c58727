"""The optional parts of an install: `pip install fxcc` is the client; servers need an extra."""

from __future__ import annotations

import importlib.util
import sys

# What each extra adds that a client install lacks (import names, not distribution names).
EXTRAS: dict[str, tuple[str, ...]] = {
    "service": ("fastapi", "uvicorn", "redis", "pydantic_settings"),
    "worker": ("redis", "pydantic_settings"),
}


def missing(extra: str) -> list[str]:
    """The modules of `extra` this install cannot import (found, not imported)."""
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def require(command: str, extra: str) -> int | None:
    """None when `command` can run; else print one line naming the extra and return exit status 2."""
    absent = missing(extra)
    if not absent:
        return None
    print(f"fxcc {command} needs the {extra} extra (missing: {', '.join(absent)}): "
          f"pip install 'fxcc[{extra}]'", file=sys.stderr)
    return 2
