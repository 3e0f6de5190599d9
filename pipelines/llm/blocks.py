"""The KV cache's blocks: who holds which, and which hold a cached prefix.

The cache is a pool of fixed-size blocks (kv_cache.py holds the tensors). Each sequence owns a
block table, the blocks of its tokens in order; a sequence that joins or leaves takes or gives
back its own blocks and moves no other sequence's cache.

Automatic prefix caching: once a full block's KV is computed, the block is published under its
prefix key (prefix.py), and a later sequence with the same cache salt whose tokens begin the
same way takes the block instead of computing it again; blocks are shared, counted by
reference, and never written once full. A block nobody holds keeps its KV until it is needed:
free blocks are handed out first, then the least recently released cached ones are evicted.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from .prefix import chain_keys
from .sequence import Sequence


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, prefix_cache: bool = True):
        self.num_blocks, self.block_size, self.prefix_cache = num_blocks, block_size, prefix_cache
        self._refs = [0] * num_blocks
        self._key: list[bytes | None] = [None] * num_blocks  # the prefix whose KV the block holds
        self._cached: dict[bytes, int] = {}  # prefix key -> block
        self._free: deque[int] = deque(range(num_blocks))  # holding nothing anyone could reuse
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unheld cached blocks, least recently used first

    @property
    def capacity(self) -> int:
        """Tokens the pool holds."""
        return self.num_blocks * self.block_size

    @property
    def available(self) -> int:
        """Blocks a sequence could take now: free ones and cached ones nobody holds."""
        return len(self._free) + len(self._evictable)

    @property
    def in_use(self) -> int:
        return self.num_blocks - self.available

    def admit(self, seq: Sequence) -> bool:
        """Give `seq` blocks for all its tokens, its cached prefix shared: False (and nothing
        taken) if the pool cannot hold it now."""
        hits = self._matches(seq, 0)
        need = -(-seq.num_tokens // self.block_size) - len(hits)
        if need > self.available - sum(1 for block in hits if self._refs[block] == 0):
            return False
        for block in hits:
            self._hold(block)
        seq.block_table = hits + [self._take() for _ in range(need)]
        seq.computed = seq.published = len(hits) * self.block_size
        if not seq.output_ids:
            seq.cached_tokens = seq.computed
        return True

    def extend_prefix(self, seq: Sequence) -> None:
        """Swap the blocks `seq` is about to compute for cached ones that another sequence
        finished meanwhile (a burst of prompts with one system prompt computes it once)."""
        if seq.computed % self.block_size:
            return
        first = seq.computed // self.block_size
        for i, block in enumerate(self._matches(seq, first), start=first):
            self._hold(block)
            self._release(seq.block_table[i])
            seq.block_table[i] = block
            seq.computed = seq.published = seq.computed + self.block_size
            if not seq.output_ids:
                seq.cached_tokens = seq.computed

    def upcoming_keys(self, seq: Sequence) -> list[bytes]:
        """The prefix keys of the full blocks `seq` has yet to compute (none with the cache off for it)."""
        if not (self.prefix_cache and seq.prefix_cache):
            return []
        return self._keys(seq, (seq.num_tokens - 1) // self.block_size)[seq.computed // self.block_size:]

    def append_slot(self, seq: Sequence) -> bool:
        """Make room for the KV of `seq`'s next token: False if the pool is out of blocks."""
        if seq.computed < len(seq.block_table) * self.block_size:
            return True
        if not self.available:
            return False
        seq.block_table.append(self._take())
        return True

    def publish(self, seq: Sequence) -> None:
        """Offer `seq`'s newly computed full blocks to later sequences."""
        full = seq.computed // self.block_size
        if not (self.prefix_cache and seq.prefix_cache) or seq.published >= full * self.block_size:
            return
        keys = self._keys(seq, full)
        for i in range(seq.published // self.block_size, full):
            block = seq.block_table[i]
            if self._key[block] is None and keys[i] not in self._cached:
                self._cached[keys[i]] = block
                self._key[block] = keys[i]
        seq.published = full * self.block_size

    def release(self, seq: Sequence) -> None:
        """Give back all of `seq`'s blocks: its tail first, so that on eviction the prefix,
        which other prompts may share, stays longest."""
        for block in reversed(seq.block_table):
            self._release(block)
        seq.block_table = []
        seq.computed = seq.published = 0

    # -- internals --------------------------------------------------------------------------

    def _matches(self, seq: Sequence, first: int) -> list[int]:
        """Cached blocks that continue `seq`'s table from block `first`. The block holding its
        last token never matches: that token is computed for its logits."""
        if not (self.prefix_cache and seq.prefix_cache):
            return []
        last = (seq.num_tokens - 1) // self.block_size
        found = []
        for key in self._keys(seq, last)[first:]:
            block = self._cached.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def _keys(self, seq: Sequence, blocks: int) -> list[bytes]:
        if len(seq.block_keys) < blocks:
            seq.block_keys = chain_keys(seq.token_ids(0, blocks * self.block_size), seq.prompt.image_spans,
                                        self.block_size, seq.block_keys, blocks, seq.params.cache_salt)
        return seq.block_keys

    def _take(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)
            del self._cached[self._key[block]]
            self._key[block] = None
        self._refs[block] = 1
        return block

    def _hold(self, block: int) -> None:
        if self._refs[block] == 0:
            del self._evictable[block]
        self._refs[block] += 1

    def _release(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if self._key[block] is None:
                self._free.append(block)
            else:
                self._evictable[block] = None
