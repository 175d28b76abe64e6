"""Sampling where the logits are (the GPU), so only token ids cross to the host.

Greedy rows and plain temperature/top-k/top-p/min-p rows are sampled on the device. Rows that
need the host sampler's state (penalties over the history, logit biases, grammar constraints, banned ids,
logprobs, per-request seeded generators) have their logits copied over and go through it; that
keeps seeded outputs identical to the CPU path.
"""
from __future__ import annotations

import torch

from .sampler import Sampler, SampleRequest, SampleResult, race, sampling_probs


def needs_host(req: SampleRequest) -> bool:
    p = req.params
    return bool(p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty or p.logit_bias
                or req.banned_ids
                or req.constraint is not None or p.logprobs is not None or req.generator is not None)


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
            index = torch.tensor(random_rows, device=self.device)
            probs = sampling_probs(logits[index], [requests[j].params for j in random_rows])
            tokens[index] = race(probs, torch.empty_like(probs).exponential_(generator=self.generator))
        return tokens.tolist()
