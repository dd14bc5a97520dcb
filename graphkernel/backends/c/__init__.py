"""The C backend: generated C kernels, their entry, toolchain, library build and cache."""
