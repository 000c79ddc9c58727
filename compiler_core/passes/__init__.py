"""Graph passes that rewrite an aten FX graph (and its GraphSpec) before lowering."""
