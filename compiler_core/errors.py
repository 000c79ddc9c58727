"""The one error family of fxcc: every failure names its class, and where known the op and node.

Each error carries a `kind`, what went wrong in a word, for whoever reports it to choose its answer
(the service maps kinds to HTTP statuses in service/handlers.py; a worker retries none of FINAL_KINDS):
- "failed": fxcc itself failed (a compiler bug, a build that broke): the default;
- "invalid": what was asked is wrong (a malformed or refused graph, one too costly to accept);
- "quota": the asker holds as much as it may (jobs, checks); later, when some finish;
- "unavailable": the service cannot answer now (its queue full, no checker); retry;
- "conflict": what was asked does not fit the state it finds (nothing left to tune).
"""

from __future__ import annotations

from typing import ClassVar, Literal

Kind = Literal["failed", "invalid", "quota", "unavailable", "conflict"]
FINAL_KINDS: frozenset[str] = frozenset({"invalid", "quota", "conflict"})  # a retry of the same request cannot help


class FxccError(Exception):
    """Base of all fxcc errors. `op` and `node` name the aten op and graph node when known."""

    kind: ClassVar[Kind] = "failed"

    def __init__(self, message: str, *, op: str | None = None, node: str | None = None) -> None:
        self.message = message
        self.op = op
        self.node = node
        where = ", ".join(f"{k}={v}" for k, v in (("node", node), ("op", op)) if v)
        super().__init__(f"{message} ({where})" if where else message)

    def to_dict(self) -> dict[str, str | None]:
        return {"error": type(self).__name__, "message": self.message, "op": self.op, "node": self.node}


class InvalidGraph(FxccError):
    """The graph spec is malformed: unknown op, bad argument, dangling reference, bad shape."""

    kind = "invalid"


class UnsupportedOp(FxccError):
    """An op that the compiler has no lowering for (callers turn it into an extern call)."""


class LoweringError(FxccError):
    """Lowering an op to loop IR failed."""


class CodegenError(FxccError):
    """Rendering Triton source failed."""


class BuildError(FxccError):
    """Building a binary (cubin) from generated source failed."""


class AutotuneError(FxccError):
    """Benchmarking kernel configs failed."""


class ArtifactError(FxccError):
    """An artifact is malformed, or a blob's digest does not match its manifest."""
