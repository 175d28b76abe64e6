"""KV-cache block accounting: allocation, reference counts and the prefix cache.

A full block is identified by a chained hash of its tokens and every token before it, rooted in the
request's LoRA adapter: the same tokens under two adapters hold different keys and values. Freed
blocks keep their contents and stay findable by hash until they are reused, least recently
freed first, so a popular system prompt survives between requests.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .sequence import Sequence


@dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    # Kept with the hash so a lookup verifies the tokens, not just a 64-bit value.
    token_ids: tuple[int, ...] = field(default_factory=tuple)
    parent_hash: int | None = None


def chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


def root_hash(seq: Sequence) -> int | None:
    """The parent of a sequence's first block: None for the base model, else its adapter's own root."""
    lora_id = seq.group.lora_id
    return None if lora_id == 0 else hash(("lora", lora_id))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Blocks with ref_count 0, least recently freed first; cached ones are evicted in that order.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0

    # -- capacity -------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- allocation -----------------------------------------------------------------------------

    def _take_free(self) -> Block:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None and self.cached.get(block.block_hash) == block_id:
            del self.cached[block.block_hash]
        block.block_hash, block.token_ids, block.parent_hash = None, (), None
        block.ref_count = 1
        return block

    def _acquire(self, block: Block) -> None:
        if block.ref_count == 0:
            del self.free[block.block_id]
        block.ref_count += 1

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} freed twice"
        if block.ref_count == 0:
            self.free[block_id] = None

    def match_prefix(self, seq: Sequence) -> list[Block]:
        """Cached blocks matching the start of `seq`; always leaves at least one token to compute."""
        if not self.enable_prefix_caching:
            return []
        matched: list[Block] = []
        parent = root_hash(seq)
        usable = (len(seq.token_ids) - 1) // self.block_size
        for i in range(usable):
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            h = chain_hash(parent, tokens)
            block_id = self.cached.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != tokens or block.parent_hash != parent:
                break
            matched.append(block)
            parent = h
        return matched

    def allocatable_tokens(self, seq: Sequence, reserve: int = 0) -> int:
        """How many more tokens `seq` can compute with its blocks and the free ones, keeping `reserve` free."""
        return (len(seq.block_table) + len(self.free) - reserve) * self.block_size - seq.num_computed_tokens

    def allocate_prompt_start(self, seq: Sequence) -> None:
        """First scheduling of a sequence: reuse cached prefix blocks and account the query."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        matched = self.match_prefix(seq)
        for block in matched:
            self._acquire(block)
        seq.block_table = [b.block_id for b in matched]
        seq.num_computed_tokens = len(matched) * self.block_size

    def record_prefix_query(self, seq: Sequence) -> None:
        """Count a request's first admission (not retries or recomputes) in the hit-rate figures."""
        if seq.index == 0 and seq.num_preemptions == 0:
            self.prefix_queries += seq.num_prompt_tokens
            self.prefix_hits += seq.num_computed_tokens
            seq.group.metrics.num_cached_prompt_tokens = seq.num_computed_tokens

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        needed = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        for _ in range(needed):
            seq.block_table.append(self._take_free().block_id)

    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past `seq`'s computed tokens: those only rejected draft tokens wrote."""
        keep = self.blocks_needed(seq.num_computed_tokens)
        for block_id in reversed(seq.block_table[keep:]):
            self._release(block_id)
        del seq.block_table[keep:]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Share the parent's full prompt blocks; the child recomputes the rest (at most one block)."""
        shared = (parent.num_prompt_tokens - 1) // self.block_size
        child.block_table = parent.block_table[:shared]
        for block_id in child.block_table:
            self._acquire(self.blocks[block_id])
        child.num_computed_tokens = shared * self.block_size

    def free_sequence(self, seq: Sequence) -> None:
        # Release in reverse so a chain's tail is evicted before its head.
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0

    # -- prefix cache registration --------------------------------------------------------------

    def register_full_blocks(self, seq: Sequence) -> None:
        """Make every fully computed block of `seq` findable by later requests. Accepted draft tokens are computed
        before they join `token_ids`; their blocks are registered once they have."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens, len(seq.token_ids)) // self.block_size
        parent = root_hash(seq)
        for i in range(full):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None:
                tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
                block.block_hash = chain_hash(parent, tokens)
                block.token_ids, block.parent_hash = tokens, parent
                self.cached.setdefault(block.block_hash, block.block_id)
            parent = block.block_hash

    def check_invariants(self) -> None:
        """Used by tests: reference counts equal the sequences holding each block."""
        free_ids = set(self.free)
        for block in self.blocks:
            assert (block.ref_count == 0) == (block.block_id in free_ids), f"block {block.block_id} inconsistent"
        for h, block_id in self.cached.items():
            assert self.blocks[block_id].block_hash == h
