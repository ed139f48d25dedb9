"""Short-term memory in Redis: an append-only, gapless log per session with a summary checkpoint.

Every multi-key change is one Lua script, so it is atomic on the server: a concurrent append is
never lost, a retried client id is stored once, and a checkpoint is written by compare-and-set.
Each part of `SessionLog` is a module with the scripts it runs: `turns` (append, read, delete),
`checkpoint`, `cursors` (the memorizer's progress and its lane moves), `lanes` (reading the lanes),
`leases`, `users` (a user's session index and tombstone), `stats`, and `layout` (moving older keys).
`keys` holds the key layout, under which every key of one session lies in one Redis Cluster slot;
`connection` the client they share.
"""

from serve_app.stores.session_log.client import SessionLog
from serve_app.stores.session_log.keys import LANE_SHARDS, lane_keys, lane_shard
from serve_app.stores.session_log.layout import LAYOUT, LAYOUT_KEY
from serve_app.stores.session_log.turns import AppendResult, SessionMeta

__all__ = ["LANE_SHARDS", "LAYOUT", "LAYOUT_KEY", "AppendResult", "SessionLog", "SessionMeta", "lane_keys", "lane_shard"]
