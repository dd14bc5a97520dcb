"""backends layer: the targets the compiler emits kernels for (c: generated C)."""
