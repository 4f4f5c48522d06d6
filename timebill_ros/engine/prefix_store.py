"""The prefix store: prompt KV kept after a prefill, so a goal sharing its head prefills less.

A goal's templated prompt is cut into blocks of ``block_tokens`` token ids; each full block's
KV (every layer, before any eviction) is kept in a tree keyed by the blocks' token ids, so
two prompts that share a head share its blocks, stored once (vLLM's automatic prefix caching
and SGLang's radix cache work this way; both are servers, not a library a custom forward can
call, hence this small store). A lookup walks the tree with the new prompt's blocks: the
longest token-exact match is what the goal copies instead of prefilling.

Limits: the store holds at most ``max_bytes`` (KV plus pooled sums); it drops the least
recently used unpinned block to make room, and a block that cannot get room is not stored
(the goal just prefilled). A match leaves the last ``fresh_tokens`` of the prompt to the
prefill (the eviction scorer's observation window must see them computed) and counts only
when it reaches ``min_tokens``.

Recency: a lookup or an insert touches its whole path leaf first, so a block is always
older than its parent; the oldest unpinned block is then a leaf, and dropping it never
orphans another. Pinned blocks (start-up prompts) pin their whole path.

Thread-safe (one lock; tensor copies are made outside it). Never imports rclpy.
"""

import collections
import dataclasses
import threading
from typing import Callable, Optional, Sequence

import torch

from timebill_ros.checks import check_int


class _Block:
    """One stored block: its token ids, KV (L, 2, H, T, D), pooled sums or None, links."""

    __slots__ = ('tokens', 'kv', 'pool', 'parent', 'children', 'pinned', 'n_bytes')

    def __init__(self, tokens, kv, pool, parent):
        self.tokens = tokens
        self.kv = kv
        self.pool = pool
        self.parent = parent
        self.children = {}
        self.pinned = False
        self.n_bytes = _bytes(kv) + (0 if pool is None else _bytes(pool))


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclasses.dataclass(frozen=True)
class PrefixMatch:
    """The cached head of one prompt: ``n_tokens`` tokens in ``blocks`` (in order); 0 = miss."""

    n_tokens: int = 0
    blocks: tuple = ()

    def pool_sum(self) -> Optional[torch.Tensor]:
        """Return the pooled layers' sums over the matched positions, (layers, hidden), or None."""
        if not self.blocks or self.blocks[0].pool is None:
            return None
        return torch.stack([block.pool for block in self.blocks]).sum(0)


@dataclasses.dataclass(frozen=True)
class PrefixStoreStats:
    """Counters of a store since start, and its size now.

    lookups made, hits (matched >= min_tokens), tokens they matched, blocks held / pinned,
    bytes held and the bound, blocks added and dropped.
    """

    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    n_blocks: int = 0
    pinned_blocks: int = 0
    bytes: int = 0
    max_bytes: int = 0
    inserted_blocks: int = 0
    dropped_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of lookups that hit, in [0, 1] (0 before any lookup)."""
        return self.hits / self.lookups if self.lookups else 0.0


class PrefixStore:
    """Token-exact prompt KV blocks under a memory bound; see the module docstring.

    block_tokens: tokens per block. max_bytes: the bound on what the store holds, bytes.
    min_tokens: a match shorter than this counts as a miss, tokens; shorter prompts are not
    stored. fresh_tokens: the prompt's last tokens always prefilled, tokens (>= 1: the
    prefill's last position gives the first answer token).
    """

    def __init__(self, block_tokens: int, max_bytes: int, min_tokens: int, fresh_tokens: int):
        self.block_tokens = check_int('block_tokens', block_tokens, 1)
        self.max_bytes = check_int('max_bytes', max_bytes)
        self.min_tokens = check_int('min_tokens', min_tokens)
        self.fresh_tokens = check_int('fresh_tokens', fresh_tokens, 1)
        self._root = _Block((), torch.empty(0), None, None)
        self._root.n_bytes = 0
        # Every stored block, oldest use first (the root is not in it).
        self._recency = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._counts = collections.Counter()

    # --- lookups -------------------------------------------------------------------------
    def usable_tokens(self, n_x: int) -> int:
        """Return the most tokens a prompt of ``n_x`` tokens may take from the store."""
        usable = (n_x - self.fresh_tokens) // self.block_tokens * self.block_tokens
        return usable if usable >= max(self.min_tokens, 1) else 0

    def match(self, token_ids: Sequence[int], count: bool = True) -> PrefixMatch:
        """Return the longest stored head of ``token_ids`` it may use, and touch it.

        count: add the lookup to the hit-rate counters (False for a re-check of a goal
        that was counted at admission).
        """
        limit = self.usable_tokens(len(token_ids))
        with self._lock:
            path = self._walk(token_ids, limit // self.block_tokens)
            n_tokens = len(path) * self.block_tokens
            if n_tokens < max(self.min_tokens, 1):
                path, n_tokens = [], 0
            self._touch(path)
            if count:
                self._counts['lookups'] += 1
                if n_tokens:
                    self._counts['hits'] += 1
                    self._counts['hit_tokens'] += n_tokens
        return PrefixMatch(n_tokens, tuple(path))

    def cached_tokens(self, token_ids: Sequence[int]) -> int:
        """Return the tokens of ``token_ids`` a prefill would take from the store now.

        A lookup like :meth:`match` (it touches the path: a goal found here is likely to
        come), counted in the hit rate.
        """
        return self.match(token_ids).n_tokens

    def held_tokens(self, token_ids: Sequence[int]) -> int:
        """Return how many leading tokens of ``token_ids`` are stored (whole blocks).

        No limit, no recency change, not counted: for reports and tests.
        """
        with self._lock:
            return len(self._walk(token_ids, len(token_ids) // self.block_tokens)) \
                * self.block_tokens

    def _walk(self, token_ids, n_blocks):
        """Return the stored blocks matching the first ``n_blocks`` blocks of ``token_ids``."""
        node, path, size = self._root, [], self.block_tokens
        for index in range(n_blocks):
            node = node.children.get(tuple(token_ids[index * size:(index + 1) * size]))
            if node is None:
                break
            path.append(node)
        return path

    def _touch(self, path):
        for node in reversed(path):  # leaf first: a parent is always newer than its children
            self._recency.move_to_end(node)

    # --- inserts -------------------------------------------------------------------------
    def insert(self, token_ids: Sequence[int],
               make_block: Callable[[int], Optional[tuple]], pin: bool = False) -> int:
        """Store the full blocks of ``token_ids`` not stored yet; return how many were added.

        make_block(index) -> (kv, pool) of block ``index`` (kv (L, 2, H, T, D), pool
        (layers, hidden) or None; copies the store may keep), or None when it cannot (the
        insert stops there). Nothing is stored for prompts under ``min_tokens``. Room is made
        by dropping least recently used unpinned blocks; a block that finds no room ends
        the insert. pin: the blocks on this prompt's path are never dropped.
        """
        size = self.block_tokens
        n_blocks = len(token_ids) // size
        if len(token_ids) < max(self.min_tokens, 1) or n_blocks == 0:
            return 0
        chunks = [tuple(token_ids[i * size:(i + 1) * size]) for i in range(n_blocks)]
        with self._lock:
            have = self._walk(token_ids, n_blocks)
        added, path = 0, list(have)
        for index in range(len(have), n_blocks):
            made = make_block(index)  # the copy, outside the lock
            if made is None:
                break
            block = _Block(chunks[index], made[0], made[1], None)
            with self._lock:
                parent = path[-1] if path else self._root
                if not self._linked(parent):  # dropped meanwhile: the rest has no parent
                    break
                existing = parent.children.get(block.tokens)
                if existing is None:
                    if not self._make_room(block.n_bytes, protect=set(map(id, path))):
                        break
                    block.parent = parent
                    parent.children[block.tokens] = block
                    self._recency[block] = None
                    self._bytes += block.n_bytes
                    self._counts['inserted_blocks'] += 1
                    added += 1
                    existing = block
                path.append(existing)
        with self._lock:
            path = [node for node in path if self._linked(node)]
            if pin:
                for node in path:
                    node.pinned = True
            self._touch(path)
        return added

    def _linked(self, node) -> bool:
        return node is self._root or node in self._recency

    def _make_room(self, n_bytes: int, protect: set) -> bool:
        """Drop least recently used unpinned leaves until ``n_bytes`` fit; False if they can't."""
        if n_bytes > self.max_bytes:
            return False
        while self._bytes + n_bytes > self.max_bytes:
            victim = next((node for node in self._recency
                           if not node.pinned and not node.children
                           and id(node) not in protect), None)
            if victim is None:
                return False
            self._drop(victim)
        return True

    def _drop(self, node) -> None:
        del node.parent.children[node.tokens]
        del self._recency[node]
        self._bytes -= node.n_bytes
        self._counts['dropped_blocks'] += 1

    def clear(self) -> None:
        """Drop every block, pinned ones too (e.g. the pooled layers changed)."""
        with self._lock:
            self._root.children.clear()
            self._recency.clear()
            self._bytes = 0

    # --- status --------------------------------------------------------------------------
    def stats(self) -> PrefixStoreStats:
        """Return the store's counters and size now."""
        with self._lock:
            counts = self._counts
            return PrefixStoreStats(
                lookups=counts['lookups'], hits=counts['hits'], hit_tokens=counts['hit_tokens'],
                n_blocks=len(self._recency),
                pinned_blocks=sum(node.pinned for node in self._recency),
                bytes=self._bytes, max_bytes=self.max_bytes,
                inserted_blocks=counts['inserted_blocks'],
                dropped_blocks=counts['dropped_blocks'])
