"""`Settings.redacted()` is what replicas log: no password of any URL or DSN setting may reach it
(kuberay/ puts the Redis and PostgreSQL passwords in exactly those URLs)."""

from __future__ import annotations

import pytest

from serve_app.settings import Settings

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    ("field", "value", "kept"),
    [
        ("redis_url", f"redis://:{SECRET}@memserve-redis:6379/0", "memserve-redis:6379/0"),
        ("redis_url", f"rediss://memserve:{SECRET}@redis.example:6380/1", "memserve:***@redis.example:6380/1"),
        ("postgres_dsn", f"postgresql://memserve:{SECRET}@memserve-postgres:5432/memserve", "memserve-postgres:5432/memserve"),
        ("postgres_dsn", f"postgresql://memserve@pg:5432/db?sslmode=require&password={SECRET}", "sslmode=require"),
        ("redis_url", f"redis://:p@{SECRET}@redis-host:6379/0", "redis-host:6379/0"),  # an unescaped @, as redis-py reads it
        ("postgres_dsn", f"host=pg user=memserve password={SECRET} dbname=memserve", "dbname=memserve"),
        ("postgres_dsn", f"host=pg password='{SECRET} with spaces' dbname=memserve", "dbname=memserve"),
        ("milvus_uri", f"https://root:{SECRET}@milvus.example:19530", "milvus.example:19530"),
        ("llm_base_url", f"http://vllm:{SECRET}@llm.example:8001/v1", "llm.example:8001/v1"),
    ],
)
def test_no_password_of_a_url_or_dsn_reaches_the_log(field, value, kept):
    logged = Settings(**{field: value}).redacted()
    assert SECRET not in logged[field] and "***" in logged[field], logged[field]
    assert kept in logged[field]
    assert SECRET not in str(logged)


def test_urls_without_credentials_and_the_other_secrets():
    logged = Settings(redis_url="redis://127.0.0.1:16379/0", milvus_token="root:Milvus", llm_api_key="sk-1").redacted()
    assert logged["redis_url"] == "redis://127.0.0.1:16379/0"
    assert logged["milvus_token"] == "***" and logged["llm_api_key"] == "***"
