"""The numpy backend: no generated code; every node runs as vectorised numpy."""
