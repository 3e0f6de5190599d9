"""Requests per minute per API key, as token buckets: a key may burst up to its
per-minute count, then gets one request per 60/N seconds.

In-process for the embedded server; in Redis when the job store is Redis, so several
API processes share one bucket per key (the refill and the take are one atomic script,
timed by the Redis server's clock, so API hosts' clocks need not agree).

Also each key's open event streams (`OpenStreams`), counted per API process: a stream holds
that process's connection and poll loop, and ends with it.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod


class RateLimiter(ABC):
    blocks = False  # True: take() waits on the network, so async callers run it in a thread

    @abstractmethod
    def take(self, name: str, per_minute: int) -> float:
        """Spend one of `name`'s tokens: 0.0 if there was one, else the seconds until there is."""


class LocalRateLimiter(RateLimiter):
    def __init__(self) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, monotonic time)
        self._lock = threading.Lock()

    def take(self, name: str, per_minute: int) -> float:
        rate, now = per_minute / 60, time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(name, (float(per_minute), now))
            tokens = min(per_minute, tokens + (now - at) * rate)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / rate
            self._buckets[name] = (tokens - 1 if wait == 0 else tokens, now)
        return wait


# KEYS: the bucket. ARGV: per-minute count. Returns the wait in seconds, as a string
# (Lua numbers come back as integers).
_TAKE = """
local capacity = tonumber(ARGV[1])
local rate = capacity / 60
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
local bucket = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(bucket[1]) or capacity
local at = tonumber(bucket[2]) or now
tokens = math.min(capacity, tokens + (now - at) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], 120)
return tostring(wait)
"""


class RedisRateLimiter(RateLimiter):
    blocks = True

    def __init__(self, url: str, prefix: str = "vidserve"):
        import redis

        self._redis = redis.Redis.from_url(url, decode_responses=True)
        self._take = self._redis.register_script(_TAKE)
        self.prefix = prefix

    def take(self, name: str, per_minute: int) -> float:
        return float(self._take(keys=[f"{self.prefix}:rate:{name}"], args=[per_minute]))

    def close(self) -> None:
        self._redis.close()


class OpenStreams:
    """How many streams each key has open in this process."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def open(self, name: str, limit: int) -> bool:
        """Count one more of `name`'s streams, unless it already has `limit` open (0: no limit)."""
        with self._lock:
            count = self._open.get(name, 0)
            if limit and count >= limit:
                return False
            self._open[name] = count + 1
            return True

    def close(self, name: str) -> None:
        with self._lock:
            count = self._open.pop(name, 0) - 1
            if count > 0:
                self._open[name] = count

    def count(self, name: str) -> int:
        return self._open.get(name, 0)
