import pytest

from endpoints.routing.lora import adapter_to_evict


def test_a_free_slot_needs_no_eviction():
    assert adapter_to_evict({"a": 1.0}, in_use=set(), max_loras=2) is None


def test_the_least_recently_used_idle_adapter_leaves():
    last_used = {"a": 3.0, "b": 1.0, "c": 2.0}
    assert adapter_to_evict(last_used, in_use=set(), max_loras=3) == "b"
    assert adapter_to_evict(last_used, in_use={"b"}, max_loras=3) == "c"


def test_all_slots_busy_is_an_error_not_an_eviction_of_a_running_adapter():
    with pytest.raises(LookupError):
        adapter_to_evict({"a": 1.0, "b": 2.0}, in_use={"a", "b"}, max_loras=2)
