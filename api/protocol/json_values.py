"""What a JSON value in any request may be beyond its type: how deeply nested."""

from __future__ import annotations

from typing import Any

# Levels of lists and objects one field's value may have: far more than any real request,
# and far fewer than the ~1000 at which Python's json gives up with a RecursionError.
MAX_JSON_DEPTH = 32


def nesting_depth(value: Any) -> int:
    """Levels of lists and objects in a parsed JSON value (0 for a scalar), counted without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in children)
    return deepest
