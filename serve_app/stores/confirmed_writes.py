"""Session-log writes acknowledged only once enough replicas confirmed them.

Redis replicates asynchronously: a primary acknowledges a write its replicas may never receive, and
a lagging replica promoted by a failover then gives the lost seqs to other messages. WAIT (WAITAOF)
counts only the writes of the connection it runs on and cannot run inside a script, so each write
and its confirmation go out as one pipeline on one connection to the primary of the write's slot.
With no replicas to wait for (`replicas` 0) a write is a plain command, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from redis.commands.core import AsyncScript
from redis.exceptions import AskError, ConnectionError, NoScriptError, TimeoutError

from serve_app.errors import ReplicaSettingError, ReplicasUnconfirmed
from serve_app.stores.redis_client import AnyRedis, is_cluster
from serve_app.stores.replica_confirm import Confirmation, choose, connected_replicas, replica_lag_bytes

logger = logging.getLogger("ray.serve")

REDIRECTS = 3
"""Rounds a write follows its slot to a new primary (a failover, a resharding) before it gives up."""
_REFRESH_EVERY_S = 0.25
"""At most one topology refresh this often: every writer of a dead primary fails at once."""


class ConfirmObserver(Protocol):
    """Where confirmation outcomes go (Prometheus in a replica)."""

    def confirm_timeout(self, command: str) -> None: ...

    def replica_lag(self, primary: str, lag_bytes: int) -> None: ...


class NoConfirmObserver:
    def confirm_timeout(self, command: str) -> None:
        pass

    def replica_lag(self, primary: str, lag_bytes: int) -> None:
        pass


class ConfirmedWrites:
    """Runs writes that must be on `replicas` replicas before they count, within `timeout_ms`."""

    def __init__(self, redis: AnyRedis, replicas: int, timeout_ms: int, observer: ConfirmObserver | None = None):
        self.redis = redis
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.observer: ConfirmObserver = observer or NoConfirmObserver()
        self.confirmation: Confirmation | None = None
        self._refreshed_at = 0.0
        self._refresh_lock = asyncio.Lock()

    async def _primary_infos(self) -> dict[str, dict[str, Any]]:
        """INFO of every primary, by address."""
        if is_cluster(self.redis):
            await self.redis.initialize()
            primaries = self.redis.get_primaries()
            infos = await asyncio.gather(*(self.redis.info("everything", target_nodes=node) for node in primaries))
            return {node.name: info for node, info in zip(primaries, infos, strict=True)}
        return {"primary": await self.redis.info("everything")}

    async def start(self) -> str:
        """Choose the confirmation command and refuse a setting the primaries cannot meet now; says
        which confirmation runs (for the start-up log)."""
        if self.replicas == 0:
            return "session-log writes are not confirmed by replicas (redis_confirm_replicas 0)"
        infos = await self._primary_infos()
        short = {name: connected_replicas(info) for name, info in infos.items() if connected_replicas(info) < self.replicas}
        if short:
            raise ReplicaSettingError(self.replicas, short)
        self.confirmation = choose(list(infos.values()), self.replicas, self.timeout_ms)
        return (
            f"session-log writes are confirmed by {self.replicas} replica(s) with {self.confirmation.name} "
            f"(timeout {self.timeout_ms} ms) on {len(infos)} primary(ies)"
        )

    async def replica_lag(self) -> dict[str, int]:
        """Each primary's furthest-behind replica, in bytes of replication stream; reported to the observer."""
        lags = {name: replica_lag_bytes(info) for name, info in (await self._primary_infos()).items()}
        for name, lag in lags.items():
            self.observer.replica_lag(name, lag)
        return lags

    async def script(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a registered script on the keys' slot and confirm it."""
        if self.confirmation is None:
            return await script(keys=list(keys), args=list(args))
        results = await self._confirmed(keys[0], [("EVALSHA", script.sha, len(keys), *keys, *args)])
        if isinstance(results[0], NoScriptError):  # a primary that never saw it (new, failed over): send it whole
            results = await self._confirmed(keys[0], [("EVAL", script.script, len(keys), *keys, *args)])
        return self._checked(results)[0]

    async def command(self, key: str, *args: Any) -> Any:
        """Run one command on `key` and confirm it."""
        if self.confirmation is None:
            return await self.redis.execute_command(*args)
        return self._checked(await self._confirmed(key, [args]))[0]

    def _checked(self, results: list[Any]) -> list[Any]:
        """The writes' replies, once the confirmation counted enough replicas."""
        assert self.confirmation is not None
        for result in results:
            if isinstance(result, Exception):
                raise result
        waits = len(self.confirmation.commands())
        written, replies = results[:-waits], results[-waits:]
        confirmed = self.confirmation.confirmed(replies)
        if confirmed < self.replicas:
            self.observer.confirm_timeout(self.confirmation.name)
            raise ReplicasUnconfirmed(confirmed, self.replicas)
        return written

    async def _confirmed(self, key: str, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The commands and the confirmation, pipelined on one connection; each reply or its error.
        A redirect means the write did not run there: follow the slot to its new primary."""
        for _ in range(REDIRECTS):
            results = await self._pipeline(key, commands)
            redirected = next((r for r in results if isinstance(r, AskError)), None)
            unreachable = next((r for r in results if isinstance(r, ConnectionError | TimeoutError)), None)
            if redirected is None or not is_cluster(self.redis):
                if unreachable is not None and is_cluster(self.redis):
                    await self._refresh()
                return results
            await self._refresh()
        return results

    async def _pipeline(self, key: str, commands: list[tuple[Any, ...]]) -> list[Any]:
        assert self.confirmation is not None
        confirm = self.confirmation.commands()
        if is_cluster(self.redis):
            node = self.redis.get_node_from_key(key)
            pipe = self.redis.pipeline()
            for command in [*commands, *confirm]:
                pipe.execute_command(*command, target_nodes=node)
            return await pipe.execute(raise_on_error=False, allow_redirections=False)
        async with self.redis.pipeline(transaction=False) as pipe:
            for command in [*commands, *confirm]:
                pipe.execute_command(*command)
            return await pipe.execute(raise_on_error=False)

    async def _refresh(self) -> None:
        """Re-read the cluster's slots (a primary died or moved), at most once per interval."""
        async with self._refresh_lock:
            if time.monotonic() - self._refreshed_at < _REFRESH_EVERY_S:
                return
            try:
                await self.redis.nodes_manager.initialize()
            except Exception as exc:  # the next write tries again; its own error is what the client hears
                logger.warning("session log: cluster topology refresh failed: %r", exc)
            self._refreshed_at = time.monotonic()
