"""vLLM's KV-cache events, as its ``--kv-events-config`` ZMQ publisher sends them, and their decoding (pure).

vLLM (``vllm/distributed/kv_events.py``) publishes one multipart message per scheduler step that changed the
prefix cache: ``(topic, seq, payload)``, ``seq`` an 8-byte big-endian counter that starts at 0 when the engine
starts, ``payload`` a msgpack array ``[ts, [event, …], data_parallel_rank]``. Each event is a msgpack map tagged
by ``type``: ``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``,
``medium``, ``lora_name``; later fields omitted when default), ``BlockRemoved`` (``block_hashes``, ``medium``) or
``AllBlocksCleared``. Block hashes are bytes (sha256) or, with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, 64-bit
ints. The simulator's engine emits the same classes (``simulator.kvcache``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

BlockHash = bytes | int


@dataclass(slots=True)
class BlockStored:
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None = None
    token_ids: list[int] = field(default_factory=list)
    block_size: int = 16
    lora_id: int | None = None
    medium: str | None = "GPU"
    lora_name: str | None = None


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list[BlockHash]
    medium: str | None = "GPU"


@dataclass(slots=True)
class AllBlocksCleared:
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class KVEventBatch:
    ts: float
    events: list[KVCacheEvent]
    data_parallel_rank: int | None = None


class BadEventBatch(ValueError):
    """A payload that is not a vLLM KV event batch."""


def _event_from(obj: Mapping) -> KVCacheEvent | None:
    kind = obj.get("type")
    if kind == "BlockStored":
        return BlockStored(
            block_hashes=list(obj.get("block_hashes") or ()),
            parent_block_hash=obj.get("parent_block_hash"),
            token_ids=list(obj.get("token_ids") or ()),
            block_size=int(obj.get("block_size") or 16),
            lora_id=obj.get("lora_id"),
            medium=obj.get("medium"),
            lora_name=obj.get("lora_name"),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(block_hashes=list(obj.get("block_hashes") or ()), medium=obj.get("medium"))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None  # a newer event kind: ignored, as vLLM's own consumers do


def batch_from(obj) -> KVEventBatch:
    """A ``KVEventBatch`` from the msgpack-decoded payload (``[ts, events, dp_rank]``)."""
    if not isinstance(obj, Sequence) or isinstance(obj, str | bytes) or len(obj) < 2:
        raise BadEventBatch("a KV event batch is an array [ts, events, data_parallel_rank]")
    ts, raw_events = obj[0], obj[1]
    if not isinstance(raw_events, Sequence) or isinstance(raw_events, str | bytes):
        raise BadEventBatch("the batch's events are not an array")
    events = [e for e in (_event_from(raw) for raw in raw_events if isinstance(raw, Mapping)) if e is not None]
    rank = obj[2] if len(obj) > 2 else None
    return KVEventBatch(ts=float(ts), events=events, data_parallel_rank=rank)


def seq_from(frame: bytes) -> int:
    """The publisher's sequence number (8 bytes, big-endian, signed: −1 ends a replay)."""
    return int.from_bytes(frame, "big", signed=True)


_HOST = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)$")


def endpoint_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` is not a ZMQ address a subscriber can connect to (``tcp://host:port``); None when it is.

    A concrete host (a name, an IPv4 address or a bracketed IPv6 one: loopback and private addresses are fine, the
    field is set by operators and actuators only), never the publisher's bind wildcard ``*``."""
    scheme, sep, rest = endpoint.partition("://")
    if scheme != "tcp" or not sep:
        return "must be tcp://host:port"
    host, colon, port = rest.rpartition(":")
    if not colon or not _HOST.match(host):
        return "must be tcp://host:port with a host name or address (not *)"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return "the port must be 1-65535"
    return None
