"""Grants on memory spaces against every sequence of calls: a generated test (Hypothesis) creates,
grants, changes, revokes and deletes on the real PostgreSQL through services/spaces.py, and after
every step each key's access to each space is what a small reference model says: the tenant's admin
administers every existing space, any other key holds exactly its latest grant, a deleted space is
no one's (and made again, starts with no grants but its creator's)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve_app.core.auth import Caller, hash_key
from serve_app.core.spaces import ROLES, allows
from serve_app.errors import SpaceForbidden, SpaceNotFound
from serve_app.schemas import SpaceIn
from serve_app.services import spaces
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from tests.in_process import replica_dependencies

SPACES = ["alpha", "beta"]
KEYS = ["k1", "k2", "k3"]
STEP = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(SPACES)),
    st.tuples(st.just("delete"), st.sampled_from(SPACES)),
    st.tuples(st.just("grant"), st.sampled_from(SPACES), st.sampled_from(KEYS), st.sampled_from(ROLES)),
    st.tuples(st.just("revoke"), st.sampled_from(SPACES), st.sampled_from(KEYS)),
)


@pytest.fixture(scope="module")
def loop_and_deps(backends):
    loop = asyncio.new_event_loop()
    settings_ = Settings(**backends.env, milvus_collection="space_grants")
    stores = loop.run_until_complete(Stores.connect(settings_))
    yield loop, replica_dependencies(settings_, stores)
    loop.run_until_complete(stores.close())
    loop.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, max_size=14))
def test_every_sequence_of_grant_changes_leaves_each_key_its_latest_grant(loop_and_deps, steps):
    loop, deps = loop_and_deps
    tenant = "grants-" + uuid.uuid4().hex[:10]
    admin = Caller(tenant, hash_key("admin-" + tenant), admin=True)
    keys = {k: Caller(tenant, hash_key(f"{k}-{tenant}")) for k in KEYS}
    model: dict[str, dict[str, str]] = {}  # space -> key -> role

    async def run() -> None:
        for step in steps:
            op, space = step[0], step[1]
            if op == "create":
                try:
                    await spaces.create_space(deps, admin, SpaceIn(space_id=space))
                    model[space] = {}
                except Exception as exc:  # 409: it exists, nothing changes
                    assert space in model and getattr(exc, "status_code", None) == 409
            elif op == "delete":
                if space in model:
                    await spaces.delete_space(deps, admin, space)
                    del model[space]
                else:
                    with pytest.raises(SpaceNotFound):
                        await spaces.delete_space(deps, admin, space)
            elif op == "grant":
                key, role = step[2], step[3]
                if space in model:
                    await spaces.put_grant(deps, admin, space, keys[key].actor, role)
                    model[space][key] = role
                else:
                    with pytest.raises(SpaceNotFound):
                        await spaces.put_grant(deps, admin, space, keys[key].actor, role)
            else:
                key = step[2]
                if space in model and key in model[space]:
                    await spaces.revoke_grant(deps, admin, space, keys[key].actor)
                    del model[space][key]
                else:
                    with pytest.raises(SpaceNotFound):
                        await spaces.revoke_grant(deps, admin, space, keys[key].actor)
            await check()

    async def check() -> None:
        for name, key in keys.items():
            seen = {s.space_id: s.role for s in await spaces.list_spaces(deps, key)}
            assert seen == {s: grants[name] for s, grants in model.items() if name in grants}
            for space in SPACES:
                role = model.get(space, {}).get(name)
                for need in ROLES:
                    if allows(role, need):
                        assert await spaces.granted_owners(deps, key, [space], need) == [spaces.space_owner(space)]
                    else:
                        expected = SpaceNotFound if role is None else SpaceForbidden
                        with pytest.raises(expected):
                            await spaces.granted_owners(deps, key, [space], need)
        assert sorted(s.space_id for s in await spaces.list_spaces(deps, admin)) == sorted(model)

    loop.run_until_complete(run())
