"""The precise prefix index: which blocks each replica's KV cache holds, from vLLM's KV-cache events (pure).

``apply(replica_id, seq, batch, now)`` folds one event batch in (``kv_events``): ``BlockStored`` adds its block
hashes, ``BlockRemoved`` drops them, ``AllBlocksCleared`` empties the replica. A router asks
``match(replica_id, hashes)`` with the request's engine block hashes (what llm-d's precise prefix-cache scorer
computes by tokenizing and hashing as vLLM does), or ``match_tokens`` with its token ids: a ``BlockStored`` that
carries token ids is also keyed by its tokens (chained from the parent block, as llm-d's indexer keys its own
"request keys"), so a consumer that has the prompt's tokens needs no copy of vLLM's hash function or seed.

Trust: the index knows what the events said, so it is only as good as their delivery. A replica's entry is
*usable* unless (a) a gap in the publisher's sequence numbers showed that batches were lost (until the replica
clears its cache or restarts), (b) requests were routed to it ``stale_after_s`` ago and no batch has arrived since
(events stopped or lag: a prefill always stores blocks), or (c) the subscriber saw the publisher's connection drop
(``disconnected``: the engine stopped, or the link did) and no batch has arrived since; that batch says which it
was. A sequence number going back is a restarted engine, whose cache is empty: its entry starts afresh, whether the
new sequence starts at 0 or the subscriber reconnected after the new engine's first batches (their blocks are then
missing from the index: it can only under-state the cache, never claim evicted blocks). Routers fall back to their
approximate index for replicas that are not usable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.routing.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

EVENTS_STALE_AFTER_S = 2.0


@dataclass
class ReplicaBlocks:
    blocks: set = field(default_factory=set)  # engine block hashes cached on the replica
    by_token_key: dict = field(default_factory=dict)  # engine hash → chained token key (when events carry tokens)
    token_keys: set = field(default_factory=set)
    last_seq: int | None = None
    last_event_s: float | None = None
    unconfirmed_since: float | None = None  # a request routed there, no batch since
    lost_events: bool = False
    disconnected: bool = False  # the publisher's connection dropped and no batch has arrived since
    batches: int = 0
    block_size: int = 0  # tokens per block, as its BlockStored events say (0: none seen yet)


def token_block_keys(token_ids: Sequence[int], block_size: int, parent: int | None = None) -> list[int]:
    """Chained keys of the full ``block_size``-token blocks of ``token_ids`` (block i's covers blocks 0..i)."""
    keys, key = [], parent
    for i in range(len(token_ids) // block_size):
        key = hash((key, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        keys.append(key)
    return keys


class KVBlockIndex:
    def __init__(self, *, stale_after_s: float = EVENTS_STALE_AFTER_S):
        self.stale_after_s = stale_after_s
        self._replicas: dict[str, ReplicaBlocks] = {}

    def replica(self, replica_id: str) -> ReplicaBlocks:
        entry = self._replicas.get(replica_id)
        if entry is None:
            entry = self._replicas[replica_id] = ReplicaBlocks()
        return entry

    # -- feeding -------------------------------------------------------------------------------------------
    def apply(self, replica_id: str, seq: int | None, batch: KVEventBatch, now: float | None = None) -> None:
        """Fold one batch in; ``now`` (default: the batch's own timestamp) is when it arrived."""
        now = batch.ts if now is None else now
        entry = self.replica(replica_id)
        if seq is not None:
            last = entry.last_seq
            if last is not None and (seq < last or (seq == last and entry.disconnected)):
                # The sequence went back: the publisher restarted (a new engine, an empty cache). Until 2026-12-05 only
                # a restart at 0 counted, and a subscriber that reconnected after the new engine's first batch took
                # every later one for a replay of the old engine's and kept its blocks.
                self._clear(entry)
            elif last is not None and seq == last:
                return  # a duplicate (replayed) batch
            elif last is not None and seq > last + 1:
                entry.lost_events = True
            entry.last_seq = seq
        entry.last_event_s, entry.unconfirmed_since, entry.disconnected = now, None, False
        entry.batches += 1
        for event in batch.events:
            if type(event) is BlockStored:
                self._stored(entry, event)
            elif type(event) is BlockRemoved:
                self._removed(entry, event.block_hashes)
            elif type(event) is AllBlocksCleared:
                self._clear(entry)

    def _stored(self, entry: ReplicaBlocks, event: BlockStored) -> None:
        entry.blocks.update(event.block_hashes)
        tokens = event.token_ids
        if not tokens or event.block_size <= 0:
            return
        entry.block_size = event.block_size
        parent = entry.by_token_key.get(event.parent_block_hash) if event.parent_block_hash is not None else None
        keys = token_block_keys(tokens, event.block_size, parent)
        for block_hash, key in zip(event.block_hashes, keys, strict=False):
            entry.by_token_key[block_hash] = key
            entry.token_keys.add(key)

    def _removed(self, entry: ReplicaBlocks, hashes: Sequence) -> None:
        blocks, by_key = entry.blocks, entry.by_token_key
        for block_hash in hashes:
            blocks.discard(block_hash)
            key = by_key.pop(block_hash, None)
            if key is not None:
                entry.token_keys.discard(key)

    def _clear(self, entry: ReplicaBlocks) -> None:
        entry.blocks.clear()
        entry.by_token_key.clear()
        entry.token_keys.clear()
        entry.lost_events = False

    def on_routed(self, replica_id: str, now: float) -> None:
        """A request went to the replica: a batch should follow (its prefill stores blocks)."""
        entry = self.replica(replica_id)
        if entry.unconfirmed_since is None:
            entry.unconfirmed_since = now

    def disconnected(self, replica_id: str) -> None:
        """The subscriber's connection to the replica's publisher dropped: the engine stopped (a restart follows
        with an empty cache) or the link did. Not usable until its next batch, whose sequence number says which. A
        replica with no entry (none seen yet, or forgotten as its subscriber was replaced) is not usable anyway and
        gets none."""
        entry = self._replicas.get(replica_id)
        if entry is not None:
            entry.disconnected = True

    def forget(self, replica_id: str) -> None:
        self._replicas.pop(replica_id, None)

    # -- reading -------------------------------------------------------------------------------------------
    def usable(self, replica_id: str, now: float) -> bool:
        """Whether the events for this replica can be trusted now (see the module docstring)."""
        entry = self._replicas.get(replica_id)
        if entry is None or entry.batches == 0 or entry.lost_events or entry.disconnected:
            return False
        return entry.unconfirmed_since is None or now - entry.unconfirmed_since <= self.stale_after_s

    def match(self, replica_id: str, hashes: Sequence) -> int:
        """Leading blocks of this chain of engine block hashes that the replica holds."""
        entry = self._replicas.get(replica_id)
        if entry is None:
            return 0
        blocks, n = entry.blocks, 0
        for block_hash in hashes:
            if block_hash not in blocks:
                break
            n += 1
        return n

    def match_tokens(self, replica_id: str, token_ids: Sequence[int], block_size: int) -> int:
        """Leading full blocks of this prompt's tokens that the replica holds (events with token ids only)."""
        entry = self._replicas.get(replica_id)
        if entry is None:
            return 0
        n = 0
        for key in token_block_keys(token_ids, block_size):
            if key not in entry.token_keys:
                break
            n += 1
        return n

    def match_keys(self, replica_id: str, keys: Sequence[int]) -> int:
        """Leading chained token keys (``token_block_keys``) that the replica holds: ``match_tokens`` with the keys
        computed once for every replica of the same block size."""
        entry = self._replicas.get(replica_id)
        if entry is None:
            return 0
        held, n = entry.token_keys, 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n

    def block_size(self, replica_id: str) -> int:
        entry = self._replicas.get(replica_id)
        return entry.block_size if entry else 0

    def blocks(self, replica_id: str) -> frozenset:
        entry = self._replicas.get(replica_id)
        return frozenset(entry.blocks) if entry else frozenset()

    def size(self, replica_id: str) -> int:
        entry = self._replicas.get(replica_id)
        return len(entry.blocks) if entry else 0
