"""fxcc's compiler: wire format, keys, lowering to Triton, artifacts. Knows nothing of HTTP or Redis."""

from fxcc.version import __version__

__all__ = ["__version__"]
