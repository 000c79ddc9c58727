"""fxcc service."""
