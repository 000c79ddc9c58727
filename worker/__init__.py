"""fxcc worker."""
