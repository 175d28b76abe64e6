"""Sampling where the logits are (the GPU), so only token ids cross to the host.

Greedy rows and plain temperature/top-k/top-p/min-p rows are sampled on the device. Rows that
need the host sampler's state (penalties over the history, grammar constraints, banned ids,
logprobs, per-request seeded generators) have their logits copied over and go through it; that
keeps seeded outputs identical to the CPU path.
"""
from __future__ import annotations

import torch

from .sampler import SampleRequest, SampleResult, Sampler


def needs_host(req: SampleRequest) -> bool:
    p = req.params
    return bool(p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty or req.banned_ids
                or req.constraint is not None or p.logprobs is not None or req.generator is not None)


def truncate(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens outside each row's top-k, nucleus and min-p sets; the first token always stays."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).expand_as(sorted_logits)
    probs = sorted_logits.softmax(dim=-1)
    drop = (ranks >= top_k[:, None]) | ((probs.cumsum(dim=-1) - probs) >= top_p[:, None])
    drop |= probs < (min_p[:, None] * probs[:, :1])
    drop[:, 0] = False
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


class DeviceSampler:
    def __init__(self, host_sampler: Sampler, device: torch.device, seed: int):
        self.host_sampler = host_sampler
        self.device = device
        self.generator = torch.Generator(device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[SampleRequest]) -> list[SampleResult]:
        """logits: [n, vocab] float32 on the device, one row per request."""
        host_rows = [i for i, r in enumerate(requests) if needs_host(r)]
        device_rows = [i for i, r in enumerate(requests) if not needs_host(r)]
        results: list[SampleResult | None] = [None] * len(requests)
        if device_rows:
            for i, token in zip(device_rows, self._sample(logits, [requests[i] for i in device_rows], device_rows)):
                results[i] = SampleResult(token)
        if host_rows:
            host = self.host_sampler(logits[torch.tensor(host_rows, device=self.device)].cpu(),
                                     [requests[i] for i in host_rows])
            for i, result in zip(host_rows, host):
                results[i] = result
        return results

    def _sample(self, logits: torch.Tensor, requests: list[SampleRequest], rows: list[int]) -> list[int]:
        if len(rows) < logits.shape[0]:
            logits = logits[torch.tensor(rows, device=self.device)]
        tokens = logits.argmax(dim=-1)
        random_rows = [j for j, r in enumerate(requests) if not r.params.greedy]
        if random_rows:
            params = [requests[j].params for j in random_rows]
            index = torch.tensor(random_rows, device=self.device)

            def column(values, dtype=torch.float32):
                return torch.tensor(values, dtype=dtype, device=self.device)

            scaled = logits[index] / column([p.temperature for p in params])[:, None]
            vocab = logits.shape[-1]
            if any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params):
                scaled = truncate(scaled, column([p.top_k if p.top_k > 0 else vocab for p in params], torch.long),
                                  column([p.top_p for p in params]), column([p.min_p for p in params]))
            probs = scaled.softmax(dim=-1)
            # Exponential race, as on the host: argmax(p / E) with E ~ Exp(1) draws from p.
            noise = torch.empty_like(probs).exponential_(generator=self.generator)
            tokens[index] = (probs / noise).argmax(dim=-1)
        return tokens.tolist()
