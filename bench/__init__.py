"""Benchmarks of graphkernel side by side with what users would pick instead (numpy, numexpr,
PyTorch eager, torch.compile, jax.jit, ONNX Runtime, MindSpore) and with the machine's copy
bandwidth. Run `python -m bench` (or `graphkernel bench`); `--quick` for a smoke run."""
