"""Loading weights by hub id: a model that is neither cached nor downloadable is one
actionable line (`ModelUnavailable`), not a page of `from_pretrained` traceback."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from vidserve.errors import ModelUnavailable


@contextmanager
def fetching(source: str) -> Iterator[None]:
    """Around `from_pretrained(source)`: OSError is how the hub client says "not cached,
    and offline or not found". A local folder's own read errors pass through unchanged."""
    try:
        yield
    except OSError as exc:
        if Path(source).expanduser().is_dir():
            raise
        raise ModelUnavailable(source) from exc
