"""Code that tests run in child processes (python -c), shared by their scripts."""

# Counts calls of torch's aot_module_simplified (in `calls`), beside fxcc's own backend.aot_runs():
# a child that reports 0 of both never ran AOTAutograd.
COUNT_AOT = """
import json, torch
import torch._dynamo.backends.common as common
from fxcc.client import backend
calls = []
real = common.aot_module_simplified
def counting(*a, **k):
    calls.append(1)
    return real(*a, **k)
common.aot_module_simplified = counting
"""
