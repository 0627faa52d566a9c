"""The tests' own wait helpers: they return as soon as a condition holds and fail with what was awaited."""

import asyncio
import time

import pytest

from tests.waiting import wait_for, wait_for_async


def test_wait_for_returns_the_first_truthy_value_without_sleeping_the_timeout():
    calls = []

    def third_time_lucky():
        calls.append(1)
        return {"seen": len(calls)} if len(calls) == 3 else None

    started = time.monotonic()
    assert wait_for(third_time_lucky, timeout=30, interval=0.01) == {"seen": 3}
    assert time.monotonic() - started < 5


def test_wait_for_names_what_never_happened_and_the_last_value():
    with pytest.raises(AssertionError, match=r"replica ready not met within 0.05 s \(last value: 0\)"):
        wait_for(lambda: 0, timeout=0.05, interval=0.01, message="replica ready")


def test_wait_for_checks_once_more_at_the_deadline():
    ready_at = time.monotonic() + 0.1
    # The interval is longer than the timeout: only the call at the deadline can see the condition hold.
    assert wait_for(lambda: time.monotonic() >= ready_at, timeout=0.15, interval=10)


def test_wait_for_async_awaits_async_conditions_and_lets_other_tasks_run():
    async def scenario():
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, done.set)

        async def is_done():
            return done.is_set()

        assert await wait_for_async(is_done, timeout=5)
        assert await wait_for_async(lambda: "plain", timeout=1) == "plain"
        with pytest.raises(AssertionError, match="a condition that never holds not met within 0.05 s"):
            await wait_for_async(lambda: False, timeout=0.05, message="a condition that never holds")

    asyncio.run(scenario())
