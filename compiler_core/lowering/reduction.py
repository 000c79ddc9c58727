"""Reduction lowerings (filled in by a later step)."""
