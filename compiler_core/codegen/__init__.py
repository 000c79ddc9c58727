"""Kernel source generation."""
