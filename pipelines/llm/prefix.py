"""Prefix-cache keys: each full block of a sequence's tokens is named by a hash chained over
every token before it, so two sequences share a block's KV only when all they hold up to the
end of that block is the same.

Image placeholder tokens all carry one id, so inside an image's span the key takes the image's
content hash and the token's place in the image instead: the same picture sent again in a
later turn matches, another picture in the same place does not.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass


@dataclass(frozen=True)
class ImageSpan:
    """Prompt tokens [start, stop) are the placeholders of the image with this content hash."""

    start: int
    stop: int
    digest: str


def chain_keys(tokens: list[int], spans: list[ImageSpan], block_size: int, known: list[bytes],
               blocks: int) -> list[bytes]:
    """The keys of the first `blocks` full blocks of `tokens`: `known` (the keys already made for
    its first blocks) extended."""
    keys = list(known)
    for block in range(len(keys), blocks):
        start, stop = block * block_size, (block + 1) * block_size
        digest = hashlib.blake2b(keys[-1] if keys else b"", digest_size=16)
        digest.update(array("q", tokens[start:stop]).tobytes())
        for span in spans:
            if span.start < stop and span.stop > start:  # the image's part in this block
                digest.update(f"{span.digest}:{max(start, span.start) - span.start}".encode())
        keys.append(digest.digest())
    return keys
