"""End to end: vectors a restarted Milvus lost come back from PostgreSQL through the memorizer.

The loss is made the way a kill -9 of Milvus Lite makes it (rows gone from Milvus only) and the
restart is announced the way a replica announces it (the reload counter in Redis)."""

from __future__ import annotations

import time
import uuid

import redis
from pymilvus import MilvusClient

from serve_app.settings import Settings
from serve_app.stores.bundle import MILVUS_RELOADS_KEY
from serve_app.stores.vectors import GRPC_OPTIONS, collection_name


def test_the_memorizer_repairs_vectors_milvus_lost(client, backends):
    user = f"repair-{uuid.uuid4().hex[:8]}"
    texts = ["Keeps the spare key under the blue pot.", "Flies to Osaka on 14 March.", "Allergic to penicillin."]
    ids = [client.post(f"/v1/users/{user}/memories", json={"text": t}).raise_for_status().json()["id"] for t in texts]

    milvus = MilvusClient(uri=backends.env["MILVUS_URI"], grpc_options=GRPC_OPTIONS)
    try:
        collection, lost = collection_name(Settings().milvus_collection), f'id in ["{ids[0]}", "{ids[2]}"]'
        milvus.delete(collection, filter=lost)
        # A Strong read waits for the time tick that applies the delete (a Milvus server's replicas
        # then see it too); Milvus Lite answers it at once.
        milvus.query(collection, filter=lost, output_fields=["id"], consistency_level="Strong")
    finally:
        milvus.close()
    listed = {m["id"] for m in client.get(f"/v1/users/{user}/memories").json()}
    assert listed == {ids[1]}

    redis.Redis.from_url(backends.env["REDIS_URL"]).incr(MILVUS_RELOADS_KEY)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and listed != set(ids):
        time.sleep(0.5)
        listed = {m["id"] for m in client.get(f"/v1/users/{user}/memories").json()}
    assert listed == set(ids)
    hits = client.post(f"/v1/users/{user}/memories/search", json={"query": "which medicine must be avoided?", "top_k": 1}).json()
    assert hits[0]["id"] == ids[2] and hits[0]["text"] == texts[2]
