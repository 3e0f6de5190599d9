"""Whether the Redis of a Celery deployment keeps what it acknowledged.

Job records and queue messages live in Redis. With its default persistence (RDB snapshots)
a crash of Redis loses every write since the last snapshot, so the API and the workers check
for the append-only file at start and refuse a Redis without it, unless told the loss is
acceptable (`allow_volatile_redis`). `vidserve check` asks the same question.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit, urlunsplit

import redis

from vidserve.errors import VidserveError
from vidserve.jobs.outages import through_outages

log = logging.getLogger("vidserve.redis")

ALLOW_FLAG = "--allow-volatile-redis"


def shown(url: str) -> str:
    """The URL as it may appear in logs and messages: any password replaced."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":PASSWORD@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# How long the API or a worker waits, at start, for a Redis that does not answer yet (it may be
# starting beside them, under compose or Kubernetes) before it gives up.
START_WAIT_SECONDS = 30.0


def aof_enabled(url: str) -> bool | None:
    """Whether the Redis at `url` writes an append-only file; None when it will not say.
    A Redis that cannot be reached is a VidserveError."""
    try:
        return _ask(url)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise VidserveError(f"cannot reach Redis at {shown(url)}: {exc}") from None


def _ask(url: str) -> bool | None:
    client = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5, socket_timeout=5)
    try:
        answer = _from_config(client)
        return answer if answer is not None else _from_info(client)
    finally:
        client.close()


def _from_config(client: redis.Redis) -> bool | None:
    try:
        value = client.config_get("appendonly").get("appendonly")
    except redis.ResponseError:  # CONFIG renamed or disabled, as managed Redis services do
        return None
    return None if value is None else value == "yes"


def _from_info(client: redis.Redis) -> bool | None:
    try:
        value = client.info("persistence").get("aof_enabled")
    except redis.ResponseError:
        return None
    return None if value is None else int(value) == 1


def _risk(where: str, enabled: bool | None) -> str:
    if enabled is None:
        return (f"could not verify that Redis at {where} persists its writes (neither CONFIG GET appendonly nor "
                "INFO persistence answered)")
    return (f"Redis at {where} runs without its append-only file, so a crash of it loses every job and queued "
            "message since its last snapshot")


def problem(url: str, enabled: bool | None) -> str:
    """One line on why the Redis at `url` (`enabled` as aof_enabled found it) is not known to be
    durable, and what to do about it."""
    where = shown(url)
    if enabled is None:
        remedy = f"make sure it runs with appendonly yes, then pass {ALLOW_FLAG} if it is known durable"
    else:
        remedy = (f"enable it with `redis-cli -u {where} CONFIG SET appendonly yes` and `appendonly yes` in "
                  f"redis.conf (or `redis-server --appendonly yes`), or pass {ALLOW_FLAG}")
    return f"{_risk(where, enabled)}: {remedy}"


def require_durable(url: str, allow_volatile: bool) -> bool:
    """At the start of the API or a worker: whether it runs on a volatile Redis (allowed), or a
    VidserveError saying how to enable persistence."""
    try:
        enabled = through_outages(lambda: _ask(url), START_WAIT_SECONDS, f"reaching Redis at {shown(url)}")
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise VidserveError(f"cannot reach Redis at {shown(url)} (waited {START_WAIT_SECONDS:g} s): {exc}") from None
    if enabled:
        return False
    if not allow_volatile:
        raise VidserveError(problem(url, enabled))
    log.warning("%s; starting anyway, as %s asks", _risk(shown(url), enabled), ALLOW_FLAG)
    return True
