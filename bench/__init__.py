"""Benchmarks: eager vs torch.compile (Inductor) vs fxcc on the GPU (not tests; `python -m bench.run`)."""
