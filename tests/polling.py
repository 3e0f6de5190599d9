"""One way for tests to wait for something that happens in another thread or process.

A single helper instead of a hand-written loop in each test: every wait gets a deadline,
and a wait that times out says what it was waiting for and what it last saw.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], *, timeout: float = 120.0, interval: float = 0.05,
               what: str = "condition") -> T:
    """Call `check` until it returns something truthy, and return that.

    An AssertionError from `check` counts as "not yet", so a check can assert with a message
    that describes the state it saw; any other exception ends the wait at once. The generous
    default timeout is a bound on a broken test, not a claim about speed: a loaded machine
    only makes the wait longer.
    """
    deadline = time.monotonic() + timeout
    while True:
        error = None
        try:
            result = check()
        except AssertionError as exc:
            result, error = None, exc
        if result:
            return result
        if time.monotonic() > deadline:
            seen = f"last check failed: {error}" if error is not None else f"last value: {result!r}"
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; {seen}") from error
        time.sleep(interval)
