"""Prefix-cache keys: each full block of a sequence's tokens is named by a hash chained over
every token before it, so two sequences share a block's KV only when all they hold up to the
end of that block is the same.

Image placeholder tokens all carry one id, so inside an image's span the key takes the image's
content hash and the token's place in the image instead: the same picture sent again in a
later turn matches, another picture in the same place does not.

Every key is also keyed by the sequence's cache salt (service.py: by default the API key that
sent it), so a prompt finds only blocks that sequences with the same salt computed: another
tenant's identical prompt is computed again, and neither its `cached_tokens` nor its time to
first token says whether anyone else sent it.
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


def salted(digest: str, salt: bytes) -> str:
    """An image's key in the vision features' cache: its content hash, kept apart per salt."""
    return hashlib.blake2b(digest.encode(), key=_hash_key(salt)).hexdigest() if salt else digest


def chain_keys(tokens: list[int], spans: list[ImageSpan], block_size: int, known: list[bytes],
               blocks: int, salt: bytes = b"") -> list[bytes]:
    """The keys of the first `blocks` full blocks of `tokens` under `salt`: `known` (the keys
    already made for its first blocks) extended."""
    keys = list(known)
    key = _hash_key(salt)
    for block in range(len(keys), blocks):
        start, stop = block * block_size, (block + 1) * block_size
        digest = hashlib.blake2b(keys[-1] if keys else b"", digest_size=16, key=key)
        digest.update(array("q", tokens[start:stop]).tobytes())
        for span in spans:
            if span.start < stop and span.stop > start:  # the image's part in this block
                digest.update(f"{span.digest}:{max(start, span.start) - span.start}".encode())
        keys.append(digest.digest())
    return keys


def _hash_key(salt: bytes) -> bytes:
    # BLAKE2's own key parameter (at most 64 bytes, so a long salt is hashed first) keeps every
    # salt's keys apart from every other's and from the unsalted ones, whatever the tokens.
    return hashlib.blake2b(salt, digest_size=32).digest() if salt else b""
