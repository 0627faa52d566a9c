"""The simulated replica's KV connector: vLLM's ``--kv-transfer-config`` on the HTTP simulator (docs/disaggregation.md).

Two connectors, as vLLM 0.32 behaves with them (tests/engine/test_pd_real_engine.py checks the shapes):

- ``ExampleConnector`` over ``shared_storage_path`` (one host). Every request looks up its prompt's first
  ``lookup_tokens(n)`` tokens (whole blocks, never the last two tokens' block) under the directory: found, those
  tokens beyond the local prefix-cache hit are loaded instead of computed (``usage.prompt_tokens_details.
  cached_tokens`` counts them, so do ``vllm:external_prefix_cache_hits`` and ``prompt_tokens_by_source
  {source="external_kv_transfer"}``); not found, the request stores its first ``store_tokens(n)`` tokens once its
  prefill is done. vLLM's connector does both whatever ``kv_role`` says, and keys on the token ids alone (no
  ``cache_salt``). The engine writes one safetensors file per layer under ``<dir>/<md5 of the ids>/``; the
  simulator writes one small JSON file there (its token count and stand-in ids). ``InfercapSharedStorageConnector``
  (the platform's, capacity/runtimes/engine_plugins) is the same with the request's ``cache_salt`` in the key.
- ``NixlConnector`` (GPUs, KV pulled over the network). A request with ``kv_transfer_params.do_remote_decode``
  is a prefill for another replica: its response carries ``kv_transfer_params`` naming this replica, the request
  and its blocks (``remote_*``), and this replica keeps a lease on them until pulled or expired. A request with
  ``kv_transfer_params.do_remote_prefill`` pulls them from ``remote_host:remote_port`` (here the prefill
  replica's own HTTP port, ``POST /kv_transfer/pull``) and decodes without computing them; a failed pull follows
  ``kv_load_failure_policy`` (``fail``: the request fails; ``recompute``: it is computed here).

The transfer takes time when the replica is given a link (``--kv-link-gbps`` and ``--kv-bytes-per-token``): a
``Link`` moves ``tokens · bytes_per_token`` at its bandwidth, shared equally among the transfers in flight on it
(processor sharing, the planner's model of a contended link). NIXL pulls use the prefill replica's link (its answer
to the pull waits for the transfer); shared-storage loads the decode replica's (the request waits before it is
scheduled). Either way the time counts in the request's TTFT.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from simulator.outputs import prompt_token_ids
from simulator.protocol import Prompt
from simulator.tokens import CHARS_PER_TOKEN

logger = logging.getLogger(__name__)

EXAMPLE, NIXL = "ExampleConnector", "NixlConnector"
# The platform's shared-storage connector (capacity/runtimes/engine_plugins): ExampleConnector keyed by cache_salt too.
SALTED = "InfercapSharedStorageConnector"
CONNECTORS = (EXAMPLE, SALTED, NIXL)
ROLES = ("kv_producer", "kv_consumer", "kv_both")
FAILURE_POLICIES = ("fail", "recompute")
KV_FILE = "sim.kv.json"
LEASE_S = 480.0  # how long a NIXL prefill keeps its blocks for a pull (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)


class KVLoadError(RuntimeError):
    """The shared directory has the prompt's folder but not its KV (the engine core dies of it)."""


@dataclass(frozen=True)
class KVTransferConfig:
    connector: str
    role: str
    shared_storage_path: str | None = None
    load_failure_policy: str = "fail"
    engine_id: str = ""


def parse_kv_transfer_config(text: str) -> KVTransferConfig:
    """``--kv-transfer-config``'s JSON, as vLLM reads it; ValueError saying what is wrong."""
    try:
        raw = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"--kv-transfer-config is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("--kv-transfer-config must be a JSON object")
    connector, role = raw.get("kv_connector"), raw.get("kv_role")
    if connector not in CONNECTORS:
        raise ValueError(f"kv_connector {connector!r}: the simulator knows {', '.join(CONNECTORS)}")
    if role not in ROLES:
        raise ValueError(f"kv_role must be one of {', '.join(ROLES)}, got {role!r}")
    extra = raw.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ValueError("kv_connector_extra_config must be a JSON object")
    path = extra.get("shared_storage_path")
    if connector in (EXAMPLE, SALTED):
        path = str(path or "/tmp")  # vLLM's default
    policy = raw.get("kv_load_failure_policy", "fail")
    if policy not in FAILURE_POLICIES:
        raise ValueError(f"kv_load_failure_policy must be one of {', '.join(FAILURE_POLICIES)}, got {policy!r}")
    engine_id = str(raw.get("engine_id") or uuid.uuid4())
    return KVTransferConfig(connector, role, path, policy, engine_id)


def lookup_tokens(prompt_tokens: int, block_size: int) -> int:
    """Tokens ExampleConnector looks up: ``align_to_block_size(n - 1)``, i.e. ((n − 2) // block) · block."""
    return max(0, (prompt_tokens - 2) // block_size * block_size)


def store_tokens(prompt_tokens: int, block_size: int) -> int:
    """Tokens ExampleConnector stores: ``align_to_block_size(n)``, i.e. ((n − 1) // block) · block. Where n − 1 is a
    multiple of the block the two differ and the engine never finds what it stored (kept, as the engine does)."""
    return max(0, (prompt_tokens - 1) // block_size * block_size)


def prefix_key(prompt: Prompt, tokens: int, salt: str | None = None) -> str:
    """The directory name of a prompt's first ``tokens`` tokens: md5 of their ids (the simulator's stand-ins for
    a text prompt: 4 characters a token), as vLLM names it from the token ids' bytes; with the request's
    ``cache_salt`` too for the platform's connector."""
    if prompt.token_ids is not None:
        data = json.dumps(prompt.token_ids[:tokens]).encode()
    else:
        data = prompt.text[: tokens * CHARS_PER_TOKEN].encode()
    if salt:
        data += b"\0" + salt.encode()
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class KVConnector:
    """One replica's connector; ``block_size`` is its engine's."""

    def __init__(self, config: KVTransferConfig, *, block_size: int, vocab_size: int = 32000):
        self.config = config
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.leases: dict[str, tuple[int, float]] = {}  # NIXL prefill: request id -> (tokens, monotonic expiry)
        self.pulls_failed = 0

    @property
    def shared_storage(self) -> bool:
        return self.config.connector in (EXAMPLE, SALTED)

    # -- ExampleConnector (and the platform's, keyed by cache_salt too) ---------------------------------------------
    def _folder(self, prompt: Prompt, tokens: int, salt: str | None) -> Path:
        salt = salt if self.config.connector == SALTED else None
        return Path(self.config.shared_storage_path) / prefix_key(prompt, tokens, salt)

    def offer(self, prompt: Prompt, salt: str | None = None) -> int:
        """Tokens the shared directory holds for this prompt (0: none), looked up as the engine does at admission.
        A folder without its file is one the engine would find and fail to read: ``KVLoadError``, which stops the
        engine (docs/disaggregation.md, Limits)."""
        tokens = lookup_tokens(prompt.tokens, self.block_size)
        folder = self._folder(prompt, tokens, salt)
        if not folder.is_dir():
            return 0
        logger.info("External Cache Hit!")
        if not (folder / KV_FILE).is_file():
            raise KVLoadError(f"No such file or directory: {folder / KV_FILE}")
        if tokens:
            logger.info("Inject KV cache of %d tokens to the paged memory", tokens)
        return tokens

    def store(self, prompt: Prompt, salt: str | None = None) -> None:
        """Write the prompt's whole blocks once its prefill is done, unless the lookup key is there already."""
        if (self._folder(prompt, lookup_tokens(prompt.tokens, self.block_size), salt) / KV_FILE).is_file():
            return
        tokens = store_tokens(prompt.tokens, self.block_size)
        if tokens <= 0:
            return
        folder = self._folder(prompt, tokens, salt)
        ids = prompt.token_ids[:tokens] if prompt.token_ids is not None else None
        if ids is None:
            ids = prompt_token_ids(prompt.text[: tokens * CHARS_PER_TOKEN], self.vocab_size)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{KV_FILE}.{os.getpid()}"
            tmp.write_text(json.dumps({"tokens": tokens, "token_ids": ids}))
            tmp.replace(folder / KV_FILE)  # atomic: a reader sees the whole file or none
        except OSError as exc:
            logger.warning("KV store to %s failed: %s", folder, exc)

    # -- NixlConnector -------------------------------------------------------------------------------
    def prefill_params(self, request_id: str, prompt_tokens: int, host: str, port: int) -> dict:
        """The ``kv_transfer_params`` of a finished prefill (vLLM's NIXL pull scheduler's ``request_finished``):
        this replica holds the blocks under a lease until the decode replica pulls them."""
        blocks = -(-prompt_tokens // self.block_size)
        expiry = time.monotonic() + LEASE_S
        self.leases[request_id] = (prompt_tokens, expiry)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(range(blocks))],
            "remote_engine_id": self.config.engine_id,
            "remote_request_id": request_id,
            "remote_host": host,
            "remote_port": port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": prompt_tokens,
            "remote_blocks_expiry_time": expiry,
            "transfer_mode": "pull",
        }

    def release(self, request_id: str) -> int | None:
        """A decode replica pulls a lease: its tokens (None when unknown or expired), which it frees."""
        lease = self.leases.pop(request_id, None)
        now = time.monotonic()
        for rid in [rid for rid, (_, expiry) in self.leases.items() if expiry < now]:
            del self.leases[rid]
        if lease is None or lease[1] < now:
            return None
        return lease[0]


def remote_prefill(params) -> dict | None:
    """The pull a decode request asks for (``do_remote_prefill`` with the ``remote_*`` fields), else None."""
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return None
    if not all(params.get(name) is not None for name in ("remote_host", "remote_port", "remote_request_id")):
        return None
    return params


def remote_decode(params) -> bool:
    """Whether a request is a prefill whose decode runs elsewhere (``do_remote_decode``)."""
    return isinstance(params, dict) and bool(params.get("do_remote_decode"))


class Link:
    """One replica's KV link: ``gbps`` gigabits per second shared equally by the transfers in flight (processor
    sharing), on the replica's simulated clock (``clock()`` in simulated seconds, ``speed`` of them a wall second)."""

    def __init__(self, gbps: float, *, clock, speed: float = 1.0):
        if gbps <= 0:
            raise ValueError("the KV link needs a positive bandwidth")
        self.rate = gbps * 1e9 / 8  # bytes per simulated second
        self.clock, self.speed = clock, speed
        self.active: list[list] = []  # [bytes left, future]
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.transfers = 0
        self.busy_bytes = 0.0

    async def transfer(self, nbytes: float) -> None:
        """Until ``nbytes`` have crossed the link beside whatever else crosses it."""
        if nbytes <= 0:
            return
        self._advance()
        entry = [float(nbytes), asyncio.get_running_loop().create_future()]
        self.active.append(entry)
        self.transfers += 1
        self.busy_bytes += nbytes
        self._reschedule()
        try:
            await entry[1]
        finally:
            if entry in self.active:  # given up (the client left): the others get its share
                self._advance()
                self.active.remove(entry)
                self._reschedule()

    def _advance(self) -> None:
        now = self.clock()
        if self.active:
            share = self.rate * max(0.0, now - self._last) / len(self.active)
            for entry in self.active:
                entry[0] -= share
        self._last = now

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.active:
            left = max(0.0, min(entry[0] for entry in self.active))
            wait_s = left * len(self.active) / self.rate / self.speed
            self._timer = asyncio.get_running_loop().call_later(wait_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._advance()
        for entry in [e for e in self.active if e[0] <= 1e-6 * self.rate]:  # a microsecond's bytes: done
            self.active.remove(entry)
            if not entry[1].done():
                entry[1].set_result(None)
        self._reschedule()
