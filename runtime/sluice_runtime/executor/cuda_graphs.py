"""CUDA graphs for decode steps: one graph per batch size on a ladder, each step padded up to the next size.

A decode step at a small batch is hundreds of short kernels whose launch cost outweighs their
work; replaying a captured graph launches them all at once. Prefill and mixed steps run eagerly:
their shapes vary too much to capture. Padding rows write their keys to slot -1 (nowhere) and have
context length 0, so they touch nothing that real rows read, and their outputs are dropped.

The ladder, the padding and the static-buffer plumbing are plain torch; only the capture itself
needs CUDA, so tests run the same path on the CPU with a capture that simply calls the step.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .attention.base import SequenceSpan
from .attention.paged import PagedAttentionMetadata

Capture = Callable[[Callable[[], None]], Callable[[], None]]


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_num_seqs (always included): padding wastes at most 15 rows."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return sizes + [max_num_seqs]


def padded_batch_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds num_seqs, or None when the step is larger than every graph."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


@dataclass
class PaddedDecode:
    """One decode step's inputs on the host, padded to a graph's batch size."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor


def pad_decode_batch(input_ids: list[int], positions: list[int], spans: list[SequenceSpan], size: int,
                     max_blocks: int, block_size: int, pin: bool) -> PaddedDecode:
    pad = size - len(spans)
    slots, tables = [], []
    for span in spans:
        last = span.context_len - 1
        slots.append(span.block_table[last // block_size] * block_size + last % block_size)
        used = span.block_table[:-(-span.context_len // block_size)]
        tables.append(used + [0] * (max_blocks - len(used)))
    tables.extend([[0] * max_blocks] * pad)

    def host(values, dtype):
        return torch.tensor(values, dtype=dtype, pin_memory=pin)

    return PaddedDecode(
        input_ids=host(input_ids + [0] * pad, torch.long),
        positions=host(positions + [0] * pad, torch.long),
        slot_mapping=host(slots + [-1] * pad, torch.long),
        context_lens=host([s.context_len for s in spans] + [0] * pad, torch.int32),
        block_tables=host(tables, torch.int32),
    )


def cuda_graph_capture() -> Capture:
    """Capture into graphs sharing one memory pool (captured largest first, smaller ones reuse it)."""
    pool = torch.cuda.graph_pool_handle()

    def capture(step: Callable[[], None]) -> Callable[[], None]:
        step()  # warm-up outside the graph: Triton compiles, cuBLAS picks its kernels
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            step()
        return graph.replay

    return capture


class DecodeGraphs:
    """Static input buffers, one replayable step per ladder size, and the shared output buffer.

    forward(input_ids, positions, meta) -> hidden states [n, hidden]; it is captured once per size
    over views of the static buffers, so a replay only needs the buffers refilled.
    """

    def __init__(self, forward: Callable[[torch.Tensor, torch.Tensor, PagedAttentionMetadata], torch.Tensor],
                 sizes: list[int], max_model_len: int, block_size: int, sliding_window: int | None,
                 hidden_size: int, dtype: torch.dtype, device: torch.device, capture: Capture):
        self.sizes = sizes
        self.block_size = block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.pin = device.type == "cuda"
        largest = sizes[-1]
        self.input_ids = torch.zeros(largest, dtype=torch.long, device=device)
        self.positions = torch.zeros(largest, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((largest,), -1, dtype=torch.long, device=device)
        self.context_lens = torch.zeros(largest, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(largest, self.max_blocks, dtype=torch.int32, device=device)
        self.output = torch.zeros(largest, hidden_size, dtype=dtype, device=device)
        self.replays: dict[int, Callable[[], None]] = {}
        for size in reversed(sizes):
            meta = PagedAttentionMetadata(
                num_decodes=size, prefills=[], slot_mapping=self.slot_mapping[:size], block_size=block_size,
                decode_block_tables=self.block_tables[:size], decode_context_lens=self.context_lens[:size],
                decode_max_context=max_model_len, sliding_window=sliding_window)

            def step(size=size, meta=meta) -> None:
                self.output[:size] = forward(self.input_ids[:size], self.positions[:size], meta)

            self.replays[size] = capture(step)

    def run(self, input_ids: list[int], positions: list[int], spans: list[SequenceSpan]) -> torch.Tensor | None:
        """Hidden states of the step's rows, or None when no graph is large enough (run it eagerly)."""
        size = padded_batch_size(len(spans), self.sizes)
        if size is None:
            return None
        host = pad_decode_batch(input_ids, positions, spans, size, self.max_blocks, self.block_size, self.pin)
        for static, values in ((self.input_ids, host.input_ids), (self.positions, host.positions),
                               (self.slot_mapping, host.slot_mapping), (self.context_lens, host.context_lens),
                               (self.block_tables, host.block_tables)):
            static[:size].copy_(values, non_blocking=True)
        self.replays[size]()
        return self.output[:len(spans)]
