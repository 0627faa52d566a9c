"""The simulated replica isolates its prefix cache by ``cache_salt`` as vLLM does (the salt is folded into the
first block's hash, so the whole chain differs), and logs what its engine was asked for (/admin/received)."""

import httpx
import pytest

from capacity.hardware.profiles import get_profile
from simulator.server import ThreadedReplica
from simulator.tokens import block_hashes, filler_text

PROMPT = filler_text(256, seed="salted")  # 16 full blocks


@pytest.fixture
def tiny():
    with ThreadedReplica(get_profile("tiny"), speed=4.0) as replica:
        yield replica


def cached(url: str, **fields) -> int:
    body = {"model": "tiny", "prompt": PROMPT + " tail", "max_tokens": 1, **fields}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return int((response.json()["usage"]["prompt_tokens_details"] or {}).get("cached_tokens") or 0)


def test_salt_changes_every_block_hash_of_the_chain():
    plain, a, b = block_hashes(PROMPT), block_hashes(PROMPT, salt="a"), block_hashes(PROMPT, salt="b")
    assert len(plain) == len(a) == 16 and block_hashes(PROMPT, salt="a") == a
    assert not set(plain) & set(a) and not set(a) & set(b)


def test_cached_tokens_only_under_the_same_salt(tiny):
    url = tiny.url
    assert cached(url, cache_salt="tenant-a") == 0
    assert cached(url, cache_salt="tenant-a") == 256  # the same salt hits every full block
    assert cached(url, cache_salt="tenant-b") == 0  # a different salt: nothing, not even the first block
    assert cached(url) == 0  # no salt is a salt of its own
    assert cached(url, cache_salt="tenant-b") == 256 and cached(url) == 256
    log = httpx.get(f"{url}/admin/received", timeout=5).json()["received"]
    assert [r["cache_salt"] for r in log] == ["tenant-a", "tenant-a", "tenant-b", None, "tenant-b", None]
    assert log[0]["priority"] == 0 and "cache_salt" in log[0]["fields"] and "cache_salt" not in log[3]["fields"]
