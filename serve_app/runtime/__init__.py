"""Process-level plumbing of replicas and launchers: CPU priority, process liveness."""
