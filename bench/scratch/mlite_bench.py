"""Scratch benchmark: filtered vector search latency in Milvus Lite 3.2.2 over gRPC.

Usage: python mlite_bench.py PORT STAGE [ROWS_PER_USER]
Stages are independent and each creates its own collections.
"""
from __future__ import annotations

import asyncio
import json
import random
import string
import sys
import time

import numpy as np
from pymilvus import AsyncMilvusClient, DataType, MilvusClient

DIM = 384
TENANT = "local"
ME = "bench-user"
OTHERS = ["other-1", "other-2", "other-3", "other-4"]
OUT_ALL = ["id", "tenant_id", "user_id", "session_id", "seq", "role", "kind", "text", "created_at"]
FILT = f'tenant_id == "{TENANT}" and user_id == "{ME}"'
FILT_USER = f'user_id == "{ME}"'
N_SEARCH = 40

PORT = int(sys.argv[1])
STAGE = sys.argv[2]
ROWS = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
URI = f"http://127.0.0.1:{PORT}"
RESULTS = []


def log(*a):
    print(*a, flush=True)


def rand_vecs(rng, n):
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


WORDS = ["memory", "user", "likes", "coffee", "meeting", "tomorrow", "project", "deadline", "python", "milvus",
         "search", "vector", "travel", "paris", "birthday", "cat", "dog", "music", "jazz", "book", "kubernetes"]


def rand_text(rng):
    out = []
    while sum(len(w) + 1 for w in out) < 100:
        out.append(WORDS[rng.integers(len(WORDS))])
    return " ".join(out)


def make_data(rows_per_user, seed=0):
    rng = np.random.default_rng(seed)
    data = {}
    for u in [ME] + OTHERS:
        vecs = rand_vecs(rng, rows_per_user)
        recs = []
        for i in range(rows_per_user):
            recs.append({
                "id": f"{u}:{i}", "vector": vecs[i].tolist(), "tenant_id": TENANT, "user_id": u,
                "session_id": f"s{i // 50}", "seq": i, "role": "user" if i % 2 else "assistant", "kind": "turn",
                "text": rand_text(rng), "created_at": 1700000000000 + i,
            })
        data[u] = (vecs, recs)
    return data


def schema(partition_key: bool, bm25: bool = False):
    s = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    s.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
    s.add_field("vector", DataType.FLOAT_VECTOR, dim=DIM)
    s.add_field("tenant_id", DataType.VARCHAR, max_length=128)
    s.add_field("user_id", DataType.VARCHAR, max_length=128, is_partition_key=partition_key)
    s.add_field("session_id", DataType.VARCHAR, max_length=128)
    s.add_field("seq", DataType.INT64)
    s.add_field("role", DataType.VARCHAR, max_length=16)
    s.add_field("kind", DataType.VARCHAR, max_length=16)
    if bm25:
        s.add_field("text", DataType.VARCHAR, max_length=16064, enable_analyzer=True)
        s.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        from pymilvus import Function, FunctionType
        s.add_function(Function(name="bm25", function_type=FunctionType.BM25,
                                input_field_names=["text"], output_field_names=["sparse"]))
    else:
        s.add_field("text", DataType.VARCHAR, max_length=16064)
    s.add_field("created_at", DataType.INT64)
    return s


def create(c: MilvusClient, name, partition_key=True, index_type="AUTOINDEX", params=None, bm25=False, scalar_inverted=False,
           metric="COSINE"):
    if c.has_collection(name):
        c.drop_collection(name)
    ip = c.prepare_index_params()
    ip.add_index(field_name="vector", index_type=index_type, metric_type=metric, params=params or {})
    if bm25:
        ip.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
    if scalar_inverted:
        ip.add_index(field_name="user_id", index_type="INVERTED")
        ip.add_index(field_name="tenant_id", index_type="INVERTED")
    c.create_collection(name, schema=schema(partition_key, bm25), index_params=ip, consistency_level="Strong")
    c.load_collection(name)


def insert(c, name, data, per_partition=False):
    t = time.perf_counter()
    for u, (_, recs) in data.items():
        if per_partition and not c.has_partition(name, u):
            c.create_partition(name, u)
        for i in range(0, len(recs), 1000):
            if per_partition:
                c.insert(name, recs[i:i + 1000], partition_name=u)
            else:
                c.insert(name, recs[i:i + 1000])
    log(f"  inserted {sum(len(r) for _, r in data.values())} rows into {name} in {time.perf_counter() - t:.1f}s")


def pct(xs, p):
    return float(np.percentile(np.array(xs) * 1000, p))


def check(hits, qv, myvecs, only_id):
    """(all rows are ME's, recall@10 vs exact top-10 over ME's rows)"""
    ids = [h["id"] for h in hits]
    if only_id:
        ok = all(i.startswith(ME + ":") for i in ids)
    else:
        ok = all(h["entity"]["user_id"] == ME and h["entity"]["tenant_id"] == TENANT and h["id"].startswith(ME + ":")
                 for h in hits)
    exact = np.argsort(-(myvecs @ qv))[:10]
    truth = {(f"{ME}:{i}" if i < ROWS else f"{ME}:new{i - ROWS}") for i in exact}
    return ok, len(truth & set(ids)) / 10.0


def bench(c, name, label, myvecs, *, filt=FILT, out=OUT_ALL, partition_names=None, search_params=None,
          n=N_SEARCH, extra=None, metric="COSINE"):
    rng = np.random.default_rng(123)
    qs = rand_vecs(rng, n + 3)
    lat, oks, recs = [], [], []
    sp = {"metric_type": metric}
    if search_params:
        sp["params"] = search_params
    kw = dict(extra or {})
    if filt:
        kw["filter"] = filt
    if partition_names:
        kw["partition_names"] = partition_names
    for i, q in enumerate(qs):
        t = time.perf_counter()
        res = c.search(name, data=[q.tolist()], limit=10, output_fields=out, search_params=sp, **kw)
        dt = time.perf_counter() - t
        if i < 3:
            continue
        lat.append(dt)
        ok, rc = check(res[0], q, myvecs, only_id=(out == ["id"] or not out))
        oks.append(ok and len(res[0]) == 10)
        recs.append(rc)
    row = {"variant": label, "p50_ms": round(pct(lat, 50), 1), "p95_ms": round(pct(lat, 95), 1),
           "only_my_rows": all(oks), "recall@10": round(float(np.mean(recs)), 3), "rows_per_user": ROWS}
    RESULTS.append(row)
    log(f"  {label:70s} p50 {row['p50_ms']:7.1f} ms  p95 {row['p95_ms']:7.1f} ms  mine={row['only_my_rows']} recall={row['recall@10']}")
    return row


def bench_two_step(c, name, label, myvecs, partition_names=None, n=N_SEARCH):
    """search returning only ids, then fetch the 10 rows with get()."""
    rng = np.random.default_rng(123)
    qs = rand_vecs(rng, n + 3)
    lat, oks, recs = [], [], []
    for i, q in enumerate(qs):
        t = time.perf_counter()
        kw = {"partition_names": partition_names} if partition_names else {}
        res = c.search(name, data=[q.tolist()], limit=10, filter=FILT, output_fields=["id"],
                       search_params={"metric_type": "COSINE"}, **kw)
        ids = [h["id"] for h in res[0]]
        rows = c.get(name, ids=ids, output_fields=OUT_ALL)
        dt = time.perf_counter() - t
        if i < 3:
            continue
        lat.append(dt)
        ok, rc = check(res[0], q, myvecs, only_id=True)
        ok = ok and all(r["user_id"] == ME for r in rows) and len(rows) == 10
        oks.append(ok)
        recs.append(rc)
    row = {"variant": label, "p50_ms": round(pct(lat, 50), 1), "p95_ms": round(pct(lat, 95), 1),
           "only_my_rows": all(oks), "recall@10": round(float(np.mean(recs)), 3), "rows_per_user": ROWS}
    RESULTS.append(row)
    log(f"  {label:70s} p50 {row['p50_ms']:7.1f} ms  p95 {row['p95_ms']:7.1f} ms  mine={row['only_my_rows']} recall={row['recall@10']}")


async def bench_async(name, label, myvecs, partition_names=None, n=N_SEARCH, metric=None):
    ac = AsyncMilvusClient(uri=URI)
    rng = np.random.default_rng(123)
    qs = rand_vecs(rng, n + 3)
    lat, oks, recs = [], [], []
    kw = {"partition_names": partition_names} if partition_names else {}
    for i, q in enumerate(qs):
        t = time.perf_counter()
        res = await ac.search(name, data=[q.tolist()], limit=10, filter=FILT, output_fields=OUT_ALL,
                              search_params={"metric_type": metric} if metric else {}, **kw)
        dt = time.perf_counter() - t
        if i < 3:
            continue
        lat.append(dt)
        ok, rc = check(res[0], q, myvecs, only_id=False)
        oks.append(ok)
        recs.append(rc)
    await ac.close()
    row = {"variant": label, "p50_ms": round(pct(lat, 50), 1), "p95_ms": round(pct(lat, 95), 1),
           "only_my_rows": all(oks), "recall@10": round(float(np.mean(recs)), 3), "rows_per_user": ROWS}
    RESULTS.append(row)
    log(f"  {label:70s} p50 {row['p50_ms']:7.1f} ms  p95 {row['p95_ms']:7.1f} ms  mine={row['only_my_rows']} recall={row['recall@10']}")


def _cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def wait_indexed(seconds=5):
    """Wait until the server's background index build is done (server CPU idle for 1.5 s)."""
    pid = int(open("/work/main/bench/scratch/server.pid").read())
    t0 = time.perf_counter()
    time.sleep(0.5)
    idle = 0.0
    last = _cpu(pid)
    while idle < 1.5 and time.perf_counter() - t0 < 300:
        time.sleep(0.5)
        cur = _cpu(pid)
        idle = idle + 0.5 if cur - last <= 2 else 0.0
        last = cur
    log(f"  waited {time.perf_counter() - t0:.1f}s for background index build")


def flush(c, name):
    t = time.perf_counter()
    c.flush(name)
    log(f"  flush {name}: {time.perf_counter() - t:.2f}s")


def dump():
    with open(f"/work/main/bench/scratch/results_{STAGE}_{ROWS}.json", "w") as f:
        json.dump(RESULTS, f, indent=1)


def main():
    c = MilvusClient(uri=URI)
    t = time.perf_counter()
    c.has_collection("x")
    log(f"has_collection {1000 * (time.perf_counter() - t):.1f} ms")
    data = make_data(ROWS)
    myvecs = data[ME][0]

    if STAGE == "pkey":
        name = "pk"
        create(c, name)
        insert(c, name, data)
        log("[partition key, AUTOINDEX, growing (memtable) segment]")
        bench(c, name, "pkey growing: tenant+user filter, all fields", myvecs, n=8)
        bench(c, name, "pkey growing: user filter only", myvecs, filt=FILT_USER, n=8)
        bench(c, name, "pkey growing: output id only", myvecs, out=["id"], n=8)
        bench(c, name, "pkey growing: no filter (index-only, WRONG rows)", myvecs, filt=None, out=["id"], n=8)
        flush(c, name)
        wait_indexed(8)
        log("[partition key, AUTOINDEX(=HNSW M16 ef64), flushed/sealed]")
        bench(c, name, "pkey sealed: tenant+user filter, all fields", myvecs)
        bench(c, name, "pkey sealed: user filter only", myvecs, filt=FILT_USER)
        bench(c, name, "pkey sealed: output id only", myvecs, out=["id"])
        bench_two_step(c, name, "pkey sealed: ids only + get(10 ids)", myvecs)
        bench(c, name, "pkey sealed: no filter (index-only, WRONG rows)", myvecs, filt=None, out=["id"])
        bench(c, name, "pkey sealed: ef=200", myvecs, search_params={"ef": 200})
        bench(c, name, "pkey sealed: consistency Bounded", myvecs, extra={"consistency_level": "Bounded"})
        asyncio.run(bench_async(name, "pkey sealed: AsyncMilvusClient", myvecs))
        parts = c.list_partitions(name)
        log("  partitions:", parts)
        import hashlib
        bucket = f"_pk_{int(hashlib.md5(ME.encode()).hexdigest(), 16) % 16}"
        try:
            bench(c, name, f"pkey sealed: partition_names=[{bucket}] + filter (internal bucket)", myvecs,
                  partition_names=[bucket])
        except Exception as e:
            log("  bucket partition search failed:", e)
        # new writes after flush -> growing rows again
        rng = np.random.default_rng(7)
        extra_vecs = rand_vecs(rng, 500)
        recs = []
        for i in range(500):
            r = dict(data[ME][1][0])
            r.update(id=f"{ME}:new{i}", vector=extra_vecs[i].tolist(), seq=100000 + i)
            recs.append(r)
        c.insert(name, recs)
        allv = np.vstack([myvecs, extra_vecs])
        # check ids prefix works with new ids too
        bench(c, name, "pkey sealed + 500 growing rows (all users' memtable=500)", allv)
        other = []
        for u in OTHERS:
            for i in range(500):
                r = dict(data[u][1][0])
                r.update(id=f"{u}:new{i}", vector=rand_vecs(rng, 1)[0].tolist(), seq=100000 + i)
                other.append(r)
        c.insert(name, other)
        bench(c, name, "pkey sealed + 2500 growing rows (500 per user)", allv, n=20)
        flush(c, name)
        wait_indexed(5)
        bench(c, name, "pkey after 2nd flush (2 segments per bucket)", allv)
        c.drop_collection(name)

    elif STAGE == "parts":
        name = "parts"
        create(c, name, partition_key=False)
        insert(c, name, data, per_partition=True)
        log("[explicit partition per user, AUTOINDEX]")
        bench(c, name, "partitions growing: partition_names=[user] + filter", myvecs, partition_names=[ME], n=8)
        flush(c, name)
        wait_indexed(8)
        bench(c, name, "partitions sealed: partition_names=[user] + tenant+user filter", myvecs, partition_names=[ME])
        bench(c, name, "partitions sealed: partition_names=[user], NO filter", myvecs, partition_names=[ME], filt=None)
        bench(c, name, "partitions sealed: partition_names=[user] + filter, id only", myvecs, partition_names=[ME], out=["id"])
        bench(c, name, "partitions sealed: filter only (no partition_names)", myvecs)
        asyncio.run(bench_async(name, "partitions sealed: async, partition_names + filter", myvecs, partition_names=[ME]))
        c.drop_collection(name)

    elif STAGE == "index":
        # one collection per index type, partition key schema, flushed
        for label, itype, params, sparams in [
            ("FLAT", "FLAT", {}, None),
            ("HNSW M16 efC200 ef64", "HNSW", {"M": 16, "efConstruction": 200}, {"ef": 64}),
            ("IVF_FLAT nlist128 nprobe16", "IVF_FLAT", {"nlist": 128}, {"nprobe": 16}),
        ]:
            name = "idx_" + itype.lower()
            create(c, name, index_type=itype, params=params)
            insert(c, name, data)
            flush(c, name)
            wait_indexed(10 if itype != "FLAT" else 3)
            bench(c, name, f"pkey sealed {label}: tenant+user filter, all fields", myvecs, search_params=sparams)
            c.drop_collection(name)
        name = "idx_inv"
        create(c, name, scalar_inverted=True)
        insert(c, name, data)
        flush(c, name)
        wait_indexed(10)
        bench(c, name, "pkey sealed AUTOINDEX + INVERTED on user_id,tenant_id", myvecs)
        c.drop_collection(name)

    elif STAGE == "percoll":
        # one collection per user (or per tenant with partitions); no filter needed
        name = "user_" + ME.replace("-", "_")
        create(c, name, partition_key=False)
        insert(c, name, {ME: data[ME]})
        for u in OTHERS:
            n2 = "user_" + u.replace("-", "_")
            create(c, n2, partition_key=False)
            insert(c, n2, {u: data[u]})
            flush(c, n2)
        flush(c, name)
        wait_indexed(10)
        bench(c, name, "collection per user sealed: no filter", myvecs, filt=None)
        bench(c, name, "collection per user sealed: tenant+user filter", myvecs)
        for u in [ME] + OTHERS:
            c.drop_collection("user_" + u.replace("-", "_"))

    elif STAGE == "reco":
        P = [ME]
        for label, itype, metric, params, sparams_list in [
            ("FLAT COSINE", "FLAT", "COSINE", {}, [None]),
            ("FLAT IP", "FLAT", "IP", {}, [None]),
            ("HNSW COSINE M16 efC200", "HNSW", "COSINE", {"M": 16, "efConstruction": 200}, [{"ef": 64}, {"ef": 128}, {"ef": 256}, {"ef": 512}]),
        ]:
            name = "reco_" + itype.lower() + metric.lower()
            create(c, name, partition_key=False, index_type=itype, params=params, metric=metric)
            insert(c, name, data, per_partition=True)
            flush(c, name)
            wait_indexed()
            for sp in sparams_list:
                bench(c, name, f"partitions sealed {label} {sp or ''}: partition_names + filter, all fields", myvecs,
                      partition_names=P, search_params=sp, metric=metric)
            if itype == "FLAT" and metric == "IP":
                asyncio.run(bench_async(name, "partitions sealed FLAT IP: AsyncMilvusClient", myvecs, partition_names=P))
                # growing tail
                rng = np.random.default_rng(7)
                for k, (mine_n, other_n) in enumerate([(100, 400), (300, 1200)]):
                    ev = rand_vecs(rng, mine_n)
                    recs = []
                    for i in range(mine_n):
                        r = dict(data[ME][1][0]); r.update(id=f"{ME}:new{k}_{i}", vector=ev[i].tolist(), seq=100000 + i)
                        recs.append(r)
                    c.insert(name, recs, partition_name=ME)
                    for u in OTHERS:
                        orecs = []
                        for i in range(other_n // 4):
                            r = dict(data[u][1][0]); r.update(id=f"{u}:new{k}_{i}", vector=rand_vecs(rng, 1)[0].tolist())
                            orecs.append(r)
                        c.insert(name, orecs, partition_name=u)
                    bench(c, name, f"  + growing (unflushed) rows: cumulative mine={[100,400][k]} others={[400,1600][k]}",
                          myvecs, partition_names=P, metric=metric, n=20)
                flush(c, name)
                wait_indexed()
                bench(c, name, "  after flush again (2 segments in my partition)", myvecs, partition_names=P, metric=metric)
            c.drop_collection(name)
        # pkey + FLAT IP for comparison
        name = "reco_pk_flatip"
        create(c, name, partition_key=True, index_type="FLAT", metric="IP")
        insert(c, name, data)
        flush(c, name)
        wait_indexed()
        bench(c, name, "pkey sealed FLAT IP: filter only", myvecs, metric="IP")
        c.drop_collection(name)

    elif STAGE == "manyflush":
        # realistic ingestion: small batches, flush after each batch -> many small segments + compaction
        name = "mf"
        create(c, name, partition_key=False, index_type="FLAT", metric="IP")
        for u in [ME] + OTHERS:
            c.create_partition(name, u)
        t = time.perf_counter()
        nflush = 0
        B = 200
        for i in range(0, ROWS, B):
            for u in [ME] + OTHERS:
                c.insert(name, data[u][1][i:i + B], partition_name=u)
            c.flush(name)
            nflush += 1
        log(f"  inserted with {nflush} flushes (every {5 * B} rows) in {time.perf_counter() - t:.1f}s")
        wait_indexed()
        import glob
        d = open("/work/main/bench/scratch/server.info").read().split()[0]
        files = glob.glob(f"{d}/**/partitions/{ME}/**/data_*.parquet", recursive=True)
        log(f"  data files in my partition dir: {len(files)}")
        bench(c, name, f"partitions FLAT IP, flushed every {B} rows/user ({len(files)} files in partition)", myvecs,
              partition_names=[ME], metric="IP")
        c.drop_collection(name)

    elif STAGE == "final":
        cols = [
            ("f_base", dict(partition_key=True), False, "COSINE", "baseline: pkey AUTOINDEX(HNSW) COSINE, filter only", [None]),
            ("f_pflatip", dict(partition_key=False, index_type="FLAT", metric="IP"), True, "IP",
             "partitions/user FLAT IP, partition_names+filter", [None]),
            ("f_pflatcos", dict(partition_key=False, index_type="FLAT", metric="COSINE"), True, "COSINE",
             "partitions/user FLAT COSINE, partition_names+filter", [None]),
            ("f_phnsw", dict(partition_key=False, index_type="HNSW", params={"M": 16, "efConstruction": 200}, metric="COSINE"),
             True, "COSINE", "partitions/user HNSW COSINE M16, partition_names+filter", [{"ef": 64}, {"ef": 512}]),
        ]
        for name, kw, pp, metric, label, sps in cols:
            create(c, name, **kw)
            insert(c, name, data, per_partition=pp)
            flush(c, name)
        wait_indexed()
        for rnd in range(2):
            for name, kw, pp, metric, label, sps in cols:
                for sp in sps:
                    bench(c, name, f"r{rnd} sealed {label} {sp or ''}", myvecs, partition_names=[ME] if pp else None,
                          metric=metric, search_params=sp, n=60)
        asyncio.run(bench_async("f_pflatip", "sealed partitions/user FLAT IP: AsyncMilvusClient", myvecs, partition_names=[ME]))
        for name, *_ in cols:
            c.drop_collection(name)

    elif STAGE == "loop":
        name = "loop"
        import os
        itype = os.environ.get("LOOP_INDEX", "AUTOINDEX")
        metric = os.environ.get("LOOP_METRIC", "COSINE")
        per_part = os.environ.get("LOOP_PARTS") == "1"
        create(c, name, partition_key=not per_part, index_type=itype, metric=metric)
        insert(c, name, data, per_partition=per_part)
        flush(c, name)
        wait_indexed()
        open("/tmp/mlite_loop_ready", "w").close()
        t0 = time.perf_counter()
        q = rand_vecs(np.random.default_rng(1), 1)[0].tolist()
        n = 0
        while time.perf_counter() - t0 < 15:
            c.search(name, data=[q], limit=10, filter=FILT, output_fields=OUT_ALL, search_params={"metric_type": metric},
                     partition_names=[ME] if per_part else None)
            n += 1
        log(f"  {n} searches in 15s")
        c.drop_collection(name)

    elif STAGE == "bm25":
        name = "bm"
        try:
            create(c, name, partition_key=True, bm25=True)
        except Exception as e:
            log("  BM25 collection create failed:", repr(e))
            return
        for u, (_, recs) in data.items():
            for r in recs:
                r.pop("sparse", None)
        insert(c, name, data)
        flush(c, name)
        wait_indexed(8)
        for q in ["coffee paris", "kubernetes deadline tomorrow"]:
            lat = []
            ok = True
            for i in range(15):
                t = time.perf_counter()
                res = c.search(name, data=[q], anns_field="sparse", limit=10, filter=FILT,
                               output_fields=["id", "user_id", "text"], search_params={"metric_type": "BM25"})
                lat.append(time.perf_counter() - t)
                ok = ok and all(h["entity"]["user_id"] == ME for h in res[0]) and len(res[0]) == 10
            log(f"  BM25 '{q}': p50 {pct(lat[2:], 50):.1f} ms p95 {pct(lat[2:], 95):.1f} ms mine={ok} "
                f"top={[(h['id'], round(h['distance'], 3)) for h in res[0][:3]]}")
            RESULTS.append({"variant": f"BM25 sealed '{q}' filter tenant+user", "p50_ms": round(pct(lat[2:], 50), 1),
                            "p95_ms": round(pct(lat[2:], 95), 1), "only_my_rows": ok, "rows_per_user": ROWS})
        c.drop_collection(name)
    dump()
    c.close()


if __name__ == "__main__":
    main()
