"""Waiting on a condition instead of sleeping a fixed time: a test moves on as soon as the condition holds, and a
condition that never holds fails with what was awaited and the last value seen, not with a later, puzzling assert."""

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def _timed_out(message: str, timeout: float, last: object) -> AssertionError:
    return AssertionError(f"{message or 'condition'} not met within {timeout} s (last value: {last!r})")


def wait_for(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.05, *, message: str = "") -> T:
    """Call ``condition`` until it returns something truthy, and return that; it is called once more at the deadline,
    so a slow machine that gets there just in time still passes."""
    deadline = time.monotonic() + timeout
    while True:
        last = condition()
        if last:
            return last
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timed_out(message, timeout, last)
        time.sleep(min(interval, left))


async def wait_for_async(
    condition: Callable[[], T | Awaitable[T]], timeout: float = 10.0, interval: float = 0.01, *, message: str = ""
) -> T:
    """``wait_for`` inside an event loop: ``condition`` may be a plain or an async function; between two calls the
    loop runs other tasks (``asyncio.sleep``), so conditions that other tasks make true can become true."""
    deadline = time.monotonic() + timeout
    while True:
        last = condition()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timed_out(message, timeout, last)
        await asyncio.sleep(min(interval, left))
