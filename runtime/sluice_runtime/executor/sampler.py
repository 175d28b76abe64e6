"""Turns the logits of one step into tokens: penalties, logit biases, masks, temperature, top-k/p, min-p, seeds.

`sampling_probs` and `race` are the sampling itself, written once for any device: the host `Sampler` runs them
on CPU logits with each request's own generator, `DeviceSampler` on the GPU with one generator for the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..sampling_params import LOGIT_BIAS_BAN, SamplingParams, TokenConstraint


@dataclass
class SampleRequest:
    """What the sampler needs to know about one row of logits."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None  # the request's seed at this position; None: the sampler's own generator
    banned_ids: list[int]  # EOS and stop ids while min_tokens is not reached
    constraint: TokenConstraint | None


@dataclass
class SampleResult:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


_MASK64 = (1 << 64) - 1


def position_generator(seed: int, position: int) -> torch.Generator:
    """The generator a seeded request samples its output token at `position` with. Keyed by the position rather
    than advanced token by token, so a draw does not depend on how many rows were drawn before it: a speculative
    verification's rejected rows leave the next token's draw as a plain decode would make it, and a seeded
    request gives the same text with or without drafts. splitmix64 spreads neighbouring seeds and positions."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return torch.Generator().manual_seed((x ^ (x >> 31)) & ((1 << 63) - 1))


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Each row's distribution: its temperature, then its top-k, nucleus and min-p sets, on the logits' device."""
    def column(values: list, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=logits.device)

    scaled = logits / column([p.temperature for p in params])[:, None]
    vocab = logits.shape[-1]
    if any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params):
        scaled = _truncate(scaled, column([p.top_k if p.top_k > 0 else vocab for p in params], torch.long),
                           column([p.top_p for p in params]), column([p.min_p for p in params]))
    return scaled.softmax(dim=-1)


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Exponential race: argmax(p / E) with E ~ Exp(1) draws from p, so a draw needs only the noise's generator."""
    return (probs / noise).argmax(dim=-1)


def _truncate(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens outside each row's top-k, nucleus and min-p sets; the first token always stays."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).expand_as(sorted_logits)
    probs = sorted_logits.softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p.
    drop = (ranks >= top_k[:, None]) | ((probs.cumsum(dim=-1) - probs) >= top_p[:, None])
    drop |= probs < (min_p[:, None] * probs[:, :1])
    drop[:, 0] = False
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def _apply_penalties(row: torch.Tensor, req: SampleRequest) -> None:
    p = req.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(req.prompt_ids) | set(req.output_ids)), dtype=torch.long)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and req.output_ids:
        counts = torch.bincount(torch.tensor(req.output_ids), minlength=row.shape[0])[: row.shape[0]].to(row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)


def _apply_logit_bias(row: torch.Tensor, bias: dict[int, float]) -> None:
    """Biases go on after the penalties and before the masks, so a grammar still decides what may follow and a
    ban holds whatever the penalties did."""
    ids = torch.tensor(list(bias), dtype=torch.long)
    values = torch.tensor([float("-inf") if b <= LOGIT_BIAS_BAN else b for b in bias.values()], dtype=row.dtype)
    row.index_add_(0, ids, values)


def _apply_constraint(row: torch.Tensor, constraint: TokenConstraint) -> None:
    allowed = constraint.allowed_tokens()
    if allowed is None:
        return
    mask = np.zeros(row.shape[0], dtype=bool)
    n = min(len(allowed), row.shape[0])
    mask[:n] = allowed[:n]
    row.masked_fill_(~torch.from_numpy(mask), float("-inf"))


class Sampler:
    """The host sampler: everything a request can ask for, with per-request seeded generators."""

    def __init__(self, seed: int):
        self.default_generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[SampleRequest]) -> list[SampleResult]:
        logits = logits.float()
        for row, req in zip(logits, requests):
            _apply_penalties(row, req)
            if req.params.logit_bias:
                _apply_logit_bias(row, req.params.logit_bias)
            if req.banned_ids:
                row[torch.tensor(req.banned_ids, dtype=torch.long)] = float("-inf")
            if req.constraint is not None:
                _apply_constraint(row, req.constraint)
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, r in enumerate(requests) if not r.params.greedy]
        if random_rows:
            probs = sampling_probs(logits[torch.tensor(random_rows)], [requests[i].params for i in random_rows])
            for j, i in enumerate(random_rows):
                generator = requests[i].generator or self.default_generator
                tokens[i] = race(probs[j], torch.empty_like(probs[j]).exponential_(generator=generator))
        return _results(logits, tokens.tolist(), requests)


def _results(logits: torch.Tensor, token_ids: list[int], requests: list[SampleRequest]) -> list[SampleResult]:
    """The sampled tokens, with the logprobs of the requests that asked for them (from the masked logits)."""
    want_logprobs = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
    logprobs = logits[want_logprobs].log_softmax(dim=-1) if want_logprobs else None
    lp_rows = {i: k for k, i in enumerate(want_logprobs)}
    results = []
    for i, req in enumerate(requests):
        result = SampleResult(token_ids[i])
        if i in lp_rows:
            row = logprobs[lp_rows[i]]
            result.logprob = float(row[token_ids[i]])
            result.top_logprobs = []
            if req.params.logprobs:
                values, ids = row.topk(req.params.logprobs)
                result.top_logprobs = list(zip(ids.tolist(), values.tolist()))
        results.append(result)
    return results
