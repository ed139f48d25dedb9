"""Ray Serve deployments: thin shells that give serve_app logic replicas, handles and batching."""
