"""Real Redis, PostgreSQL and Milvus Lite servers from their PyPI wheels, for `memserve up` and tests."""
