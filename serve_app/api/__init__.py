"""The HTTP surface: the FastAPI app, its routers (one per resource), auth and error responses."""
