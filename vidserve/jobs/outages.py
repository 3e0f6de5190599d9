"""What an outage is, and riding one out.

An outage is a job store or a storage that cannot be reached: nothing is wrong with the
request or the job, and the same call may work in a moment. The API answers 503 with
Retry-After for one; the runner retries through one and never fails a job for it.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Callable, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vidserve.storage import StorageUnavailable

log = logging.getLogger("vidserve.jobs.outages")

T = TypeVar("T")

# What the job stores raise while their database is away: SQLite locked or unreadable,
# Redis down or not answering.
STORE_UNAVAILABLE = (sqlite3.OperationalError, RedisConnectionError, RedisTimeoutError)
OUTAGES = (*STORE_UNAVAILABLE, StorageUnavailable)

FIRST_DELAY = 0.25
MAX_DELAY = 5.0


def through_outages(call: Callable[[], T], seconds: float, what: str) -> T:
    """`call()`, tried again with a doubling pause (FIRST_DELAY up to MAX_DELAY) while it
    raises an outage error, until `seconds` have passed; then that last error is raised.
    Any other exception passes straight through. `what` names the call in the log."""
    deadline = time.monotonic() + seconds
    delay = FIRST_DELAY
    while True:
        try:
            return call()
        except OUTAGES as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            log.warning("%s: %s; trying again in %.2g s", what, exc, min(delay, left))
            time.sleep(min(delay, left))
            delay = min(delay * 2, MAX_DELAY)
