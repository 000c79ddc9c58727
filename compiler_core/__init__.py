"""fxcc's compiler: wire format, keys, lowering to Triton, artifacts. Knows nothing of HTTP or Redis."""

__version__ = "0.1.0"
