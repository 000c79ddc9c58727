"""Lowering of flex_attention and its backward: Triton templates with the mods inlined (codegen.flex_attention)."""
