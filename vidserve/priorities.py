"""Job priorities: `low`, `normal`, `high`, what a key may ask for, and how waiting raises one.

A priority orders jobs only among those waiting for the same workers: a running job is never
stopped for a higher one. A key asks at most its `max_priority` (keys file; `normal` for users,
`high` for admins)."""

from __future__ import annotations

from typing import Literal, get_args

Priority = Literal["low", "normal", "high"]
PRIORITIES: tuple[Priority, ...] = get_args(Priority)  # lowest first: a priority's level is its index
HIGHEST = len(PRIORITIES) - 1


def level(priority: Priority) -> int:
    return PRIORITIES.index(priority)


def allows(max_priority: Priority, asked: Priority) -> bool:
    return level(asked) <= level(max_priority)
