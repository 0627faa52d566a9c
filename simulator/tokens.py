"""The simulator's tokenizer, in one place: **one token = 4 characters** of text (pure).

Everything that counts tokens for the simulated runtime uses these functions, so a workload can build a
prompt of an exact token count (``filler_text(2048)`` is a 2,048-token system prompt) and the engine's
prefix-cache blocks (16 tokens = 64 characters) line up with the router's 64-character prefix blocks.

Chat prompts are rendered with ``render_chat``: ``<|role|>\\n`` + content + ``\\n`` per message, then
``<|assistant|>\\n``; so a shared system prompt is a shared text prefix and hits the prefix cache.
Generated text is deterministic: output token i is ``OUTPUT_WORDS[i % len]`` (4 characters each), so
``count_tokens(output) == completion_tokens`` exactly.
"""

from __future__ import annotations

import hashlib
import random
import zlib

CHARS_PER_TOKEN = 4
BLOCK_SIZE_TOKENS = 16
BLOCK_CHARS = CHARS_PER_TOKEN * BLOCK_SIZE_TOKENS

# Every word is exactly CHARS_PER_TOKEN characters, so n words are n tokens.
OUTPUT_WORDS = (" the", " sim", " ran", " one", " GPU", " and", " got", " ten", " new", " tok", " for", " you")
assert all(len(w) == CHARS_PER_TOKEN and w.isascii() and '"' not in w and "\\" not in w for w in OUTPUT_WORDS)
_FILLER_WORDS = ("data", "node", "gpus", "kv_c", "fast", "slow", "tick", "rack", "warm", "cold", "load", "unit")


def count_tokens(text: str) -> int:
    """Tokens in ``text``: ceil(len / 4); the empty string is 0 tokens."""
    return -(-len(text) // CHARS_PER_TOKEN)


def render_chat(messages: list[dict], *, add_generation_prompt: bool = True, continue_final: bool = False) -> str:
    """The prompt text a chat request is tokenized from (a minimal, deterministic chat template). As in vLLM (the
    tokenizer's ``apply_chat_template``): ``add_generation_prompt`` opens the assistant's turn; ``continue_final``
    (``continue_final_message``) leaves the last message open, cut right after its content, for the model to go on."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        parts.append(f"<|{message.get('role', 'user')}|>\n{content or ''}\n")
    if continue_final and parts:
        parts[-1] = parts[-1][:-1]
    elif add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


_OUTPUT_CYCLE = "".join(OUTPUT_WORDS)


def output_text(start: int, count: int) -> str:
    """The text of output tokens ``start .. start+count-1`` of any request."""
    if count <= 0:
        return ""
    width = len(_OUTPUT_CYCLE)
    first = (start * CHARS_PER_TOKEN) % width
    need = count * CHARS_PER_TOKEN
    return (_OUTPUT_CYCLE * (2 + need // width))[first : first + need]


_POOL_TOKENS = 1 << 16
_pool: list[str] = []


def _filler_pool() -> str:
    if not _pool:
        _pool.append("".join(random.Random(20260101).choices(_FILLER_WORDS, k=_POOL_TOKENS)))
    return _pool[0]


def filler_text(tokens: int, *, seed: int | str = 0) -> str:
    """Deterministic text of exactly ``tokens`` tokens (4·tokens characters); different seeds differ early.

    A slice of a fixed random pool at a seed-chosen offset: cheap enough for workloads of 10,000 prompts.
    """
    if tokens <= 0:
        return ""
    pool = _filler_pool()
    offset = (zlib.crc32(str(seed).encode()) % _POOL_TOKENS) * CHARS_PER_TOKEN
    need = tokens * CHARS_PER_TOKEN
    text = pool[offset : offset + need]
    while len(text) < need:
        text += pool[: need - len(text)]
    return text


def distinct_text(tokens: int, *, seed: str) -> str:
    """``filler_text`` whose first block is a digest of ``seed``: distinct seeds give prompts with no block in common.

    ``filler_text`` has only 65,536 offsets, and CRC-32 is linear, so seeds that differ in a few digits (``x-1000``
    … ``x-1999``) fall on few of them: up to half of a run of a thousand such prompts repeated an earlier one. A
    workload of independent prompts needs this instead.
    """
    text = filler_text(tokens, seed=seed)
    head = hashlib.blake2b(seed.encode(), digest_size=BLOCK_CHARS // 2).hexdigest()
    return (head + text[BLOCK_CHARS:])[: len(text)]


def block_hashes(text: str, *, salt: str | None = None, parent: int | None = None) -> list[int]:
    """Chained hashes of the prompt's full 16-token blocks: block i's hash covers blocks 0..i.

    ``salt`` (vLLM's ``cache_salt``) is mixed into block 0 only, isolating the whole chain. ``parent``
    continues a chain (for text that follows a block-aligned prefix). The hash values are process-local
    (like vLLM's random NONE_HASH); only equality matters.
    """
    full_blocks = count_tokens(text) // BLOCK_SIZE_TOKENS
    if parent is None:
        parent = hash(("infercap-sim", salt))
    hashes = []
    for i in range(full_blocks):
        parent = hash((parent, text[i * BLOCK_CHARS : (i + 1) * BLOCK_CHARS]))
        hashes.append(parent)
    return hashes


def partial_block(text: str) -> str:
    """The text after the prompt's last full block (where generated tokens continue the chain)."""
    return text[(count_tokens(text) // BLOCK_SIZE_TOKENS) * BLOCK_CHARS :]
