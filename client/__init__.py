"""fxcc's client: the Dynamo backend, capture, caches, the HTTP client and the plan runtime."""

from typing import Any

__all__ = ["explain"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `fxcc serve` and `fxcc worker` do not import the backend.
    if name == "explain":
        from fxcc.client.explain import explain

        return explain
    raise AttributeError(name)
