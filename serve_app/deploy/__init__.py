"""Running the app: strict checks of Serve configs and Kubernetes manifests, and a local Ray."""
