"""The one error family of fxcc: every failure names its class, and where known the op and node."""

from __future__ import annotations


class FxccError(Exception):
    """Base of all fxcc errors. `op` and `node` name the aten op and graph node when known."""

    http_status = 500

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

    http_status = 422


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
