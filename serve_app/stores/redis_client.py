"""One Redis client for a single server, a primary watched by Sentinel, or a Redis Cluster."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from urllib.parse import unquote

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

AnyRedis = aioredis.Redis | RedisCluster


def connect(url: str, *, cluster: bool = False, sentinel_master: str = "") -> AnyRedis:
    """`cluster`: the URL names one node of a Redis Cluster (redis-py has no URL scheme for it);
    the client finds the others and routes each command by slot. `sentinel_master`: the URL names
    the Sentinels (`redis://[:password@]host:port[,host:port...]/db`) and the client follows that
    primary through failovers; the password and db are the primary's.

    A cluster client sends no CLIENT SETINFO on connect: with it, redis-py 8.1's async cluster
    client broke connections that concurrent commands opened at once on a new cluster
    (AttributeError on a closed writer; 8 of 25 runs of ten concurrent writers here, 0 of 25
    without it). The names it would set are only labels in CLIENT LIST."""
    if cluster:
        return RedisCluster.from_url(url, decode_responses=True, health_check_interval=30, lib_name=None, lib_version=None)
    if sentinel_master:
        target = sentinel_target(url)
        sentinel = Sentinel(target.sentinels, socket_timeout=5)
        return sentinel.master_for(
            sentinel_master, decode_responses=True, password=target.password, db=target.db, health_check_interval=30
        )
    return aioredis.from_url(url, decode_responses=True, health_check_interval=30)


@dataclass(frozen=True)
class SentinelTarget:
    sentinels: list[tuple[str, int]]
    password: str | None
    db: int


def sentinel_target(url: str) -> SentinelTarget:
    """The Sentinels of a `redis://[:password@]host:port[,host:port...]/db` URL (redis-py parses
    only one host per URL)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "redis":
        raise ValueError(f"a Sentinel URL is redis://[:password@]host:port[,host:port...]/db, not {url!r}")
    userinfo, _, hostpart = rest.rpartition("@")
    hosts, _, db = hostpart.partition("/")
    password = unquote(userinfo.partition(":")[2]) if userinfo else ""
    sentinels = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        sentinels.append((name, int(port or 26379)) if name else (host, 26379))
    return SentinelTarget(sentinels=sentinels, password=password or None, db=int(db or 0))


def is_cluster(client: AnyRedis) -> bool:
    return isinstance(client, RedisCluster)


_REDIS_PACKAGE = PurePath(redis.__file__).parent


def closed_connection(exc: BaseException) -> bool:
    """redis-py's own AttributeError on a connection closed under a command (its reader or writer
    already None): the store went away mid-command, like a ConnectionError, not a fault here."""
    if not isinstance(exc, AttributeError) or getattr(exc, "obj", object()) is not None:
        return False
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and PurePath(frame.tb_frame.f_code.co_filename).is_relative_to(_REDIS_PACKAGE)
