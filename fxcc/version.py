"""fxcc's version: a leaf module (pyproject reads it; keys and caches name it without importing fxcc's parts)."""

__version__ = "0.1.0"
