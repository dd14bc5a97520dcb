"""graph_kernel layer."""
