"""Loop IR: ops vocabulary and handlers, buffers, Pointwise/Reduction nodes, tensor values."""
