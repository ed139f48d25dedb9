"""I/O orchestration over the stores and the pure core; no Ray, so it is testable without Serve."""
