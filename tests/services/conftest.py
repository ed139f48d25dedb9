"""Fixtures of the service tests: a replica's dependencies, built in process as an Ingress replica
builds them, on the session's real Redis, PostgreSQL and Milvus Lite and the real embedding model.
Each test works in a tenant of its own, so tests share the stores without seeing each other."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from serve_app.core.auth import Caller, hash_key
from serve_app.services.dependencies import Dependencies
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from tests.in_process import replica_dependencies
from tests.services.seed import new_id

SERVICES_COLLECTION = "services"
SERVICES_REDIS_DB = 4
"""A Redis database of their own: the sessions these tests leave wait in the embedding lane (no
memorizer runs here), where the sweep tests' passes would otherwise find them."""

MakeDeps = Callable[..., Dependencies]


@pytest.fixture(scope="session")
def services_env(backends) -> dict[str, str]:
    base = backends.env["REDIS_URL"].rsplit("/", 1)[0]
    return backends.env | {"REDIS_URL": f"{base}/{SERVICES_REDIS_DB}"}


@pytest.fixture(scope="session")
async def services_stores(services_env):
    stores = await Stores.connect(Settings(**services_env, milvus_collection=SERVICES_COLLECTION))
    yield stores
    await stores.close()


@pytest.fixture
def make_deps(services_env, services_stores, embed) -> MakeDeps:
    """Dependencies under settings that `overrides` change (quotas, rate limits, the model), on the
    same stores: settings decide what a service allows, not where it stores."""

    def make(**overrides) -> Dependencies:
        settings = Settings(**services_env, milvus_collection=SERVICES_COLLECTION, **overrides)
        return replica_dependencies(settings, services_stores, embed)

    return make


@pytest.fixture
def deps(make_deps) -> Dependencies:
    return make_deps()


@pytest.fixture
def caller() -> Caller:
    """A caller with a key of a tenant of the test's own."""
    return Caller(new_id("tenant"), hash_key(new_id("key")))
