"""What the proxy decides for the engine instead of the tenant (pure): the prefix-cache salt that keeps one
tenant's cached prompt blocks out of another's reach, and the body fields no tenant may hand to the engine."""

from __future__ import annotations

import hashlib
import hmac
import json

# vLLM mixes ``cache_salt`` into the hash of a prompt's first KV block, so every chained block hash differs
# between salts: a tenant's prompt can only hit blocks cached under its own salt. Without it, tenant B learns
# from ``cached_tokens`` (or from TTFT) whether tenant A sent a prompt, one 16-token block at a time.
_SALT_CONTEXT = b"infercap.proxy.cache_salt.v1"


class CacheSalts:
    """One salt per tenant: HMAC-SHA256 of the tenant id under a key derived from the deployment's secret, so
    nobody can compute (and send) another tenant's salt, and every proxy process computes the same one."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("a secret is required to derive tenant cache salts")
        self._key = hmac.new(secret.encode(), _SALT_CONTEXT, hashlib.sha256).digest()
        self._salts: dict[int, str] = {}

    def for_tenant(self, tenant_id: int) -> str:
        salt = self._salts.get(tenant_id)
        if salt is None:
            salt = hmac.new(self._key, str(tenant_id).encode(), hashlib.sha256).hexdigest()[:32]
            self._salts[tenant_id] = salt
        return salt


# Set by the proxy on every upstream body (``request.upstream_payload``): the client's value never reaches the
# engine. ``priority`` orders the engine's queue for everyone on the replica; ``request_id`` names the engine's
# internal request (the proxy's X-Request-Id already does).
CONTROLLED_FIELDS = frozenset({"cache_salt", "priority", "request_id"})
STRIPPED_FIELDS = frozenset({"request_id"})

# vLLM extensions that reach engine internals beyond one request's own sampling: refused with a 400, since
# silently dropping them would change what the client asked for.
#   kv_transfer_params: disaggregated prefill, names remote engines and KV blocks to pull (another request's cache);
#   vllm_xargs / extra_args: arbitrary arguments for engine plugins and custom logits processors;
#   logits_processors: processor classes the engine would construct; prompt_embeds: raw tensors the engine loads;
#   chat_template: a template the server renders (a costly or hostile one stalls the API server for everyone).
REFUSED_FIELDS = (
    "kv_transfer_params",
    "vllm_xargs",
    "extra_args",
    "logits_processors",
    "prompt_embeds",
    "chat_template",
)

# Fields whose size costs the engine per step for the whole batch (stop-string scans, logit masks, grammar
# compilation): bounded.
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 512  # per stop string
MAX_TOKEN_ID_LIST = 256  # stop_token_ids, bad_words, allowed_token_ids
MAX_LOGIT_BIAS = 1024  # entries
MAX_STRUCTURED_CHARS = 32 * 1024  # a regex, grammar or JSON schema, serialised
_TOKEN_ID_LISTS = ("stop_token_ids", "bad_words", "allowed_token_ids")
_STRUCTURED = (
    "guided_regex",
    "guided_grammar",
    "guided_json",
    "guided_choice",
    "structured_outputs",
    "response_format",
)


class FieldRefused(ValueError):
    """A body field the platform does not pass to the engine, or one over its bound; ``param`` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _size(value) -> int:
    if isinstance(value, str):
        return len(value)
    try:
        return len(json.dumps(value, separators=(",", ":")))
    except (TypeError, ValueError):
        return MAX_STRUCTURED_CHARS + 1


def engine_field_errors(body: dict) -> None:
    """Raise ``FieldRefused`` for the first refused or oversized field of a parsed request body."""
    for name in REFUSED_FIELDS:
        if name in body:
            raise FieldRefused(f"'{name}' is not accepted by this platform.", name)
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise FieldRefused("'stop' must be a string or an array of strings.", "stop")
        if len(stops) > MAX_STOP_SEQUENCES:
            raise FieldRefused(f"'stop' has {len(stops)} sequences; at most {MAX_STOP_SEQUENCES} are allowed.", "stop")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise FieldRefused(f"Each 'stop' sequence may have at most {MAX_STOP_CHARS} characters.", "stop")
    for name in _TOKEN_ID_LISTS:
        value = body.get(name)
        if isinstance(value, list) and len(value) > MAX_TOKEN_ID_LIST:
            raise FieldRefused(f"'{name}' has {len(value)} entries; at most {MAX_TOKEN_ID_LIST} are allowed.", name)
    if body.get("use_beam_search"):
        # vLLM runs beam search in its API server as one engine request per beam and per output token, each with the
        # whole sequence so far as its prompt; the usage it answers counts one answer. Work the books cannot see.
        raise FieldRefused("'use_beam_search' is not accepted by this platform.", "use_beam_search")
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise FieldRefused("'logit_bias' must be an object of token id to bias.", "logit_bias")
        if len(bias) > MAX_LOGIT_BIAS:
            raise FieldRefused(
                f"'logit_bias' has {len(bias)} entries; at most {MAX_LOGIT_BIAS} are allowed.", "logit_bias"
            )
    for name in _STRUCTURED:
        value = body.get(name)
        if value is not None and _size(value) > MAX_STRUCTURED_CHARS:
            raise FieldRefused(
                f"'{name}' is larger than {MAX_STRUCTURED_CHARS} characters; use a smaller schema, grammar or regex.",
                name,
            )
