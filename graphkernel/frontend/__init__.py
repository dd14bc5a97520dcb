"""Frontend: Tensor, Cell, primitives, context, tracing construct into the IR, the driver."""
