"""General passes and the pass manager (stages, verification, dumps)."""
