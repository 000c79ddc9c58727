"""fxcc client."""
