"""Real Redis, PostgreSQL and Milvus (a standalone server, or Milvus Lite) from their PyPI wheels, for `memserve up` and tests."""
