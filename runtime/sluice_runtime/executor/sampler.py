"""Turns the logits of one step into tokens: penalties, masks, temperature, top-k/p, min-p, seeds."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch



@dataclass
class SampleRequest:
    """What the sampler needs to know about one row of logits (params: the engine's SamplingParams)."""

    params: object
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None
    banned_ids: list[int]  # EOS and stop ids while min_tokens is not reached
    constraint: object | None


@dataclass
class SampleResult:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


def _apply_penalties(row: torch.Tensor, req: SampleRequest) -> None:
    p = req.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(req.prompt_ids) | set(req.output_ids)), dtype=torch.long)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and req.output_ids:
        counts = torch.bincount(torch.tensor(req.output_ids), minlength=row.shape[0])[: row.shape[0]].to(row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)


def _apply_constraint(row: torch.Tensor, constraint) -> None:
    allowed = constraint.allowed_tokens()
    if allowed is None:
        return
    mask = np.zeros(row.shape[0], dtype=bool)
    n = min(len(allowed), row.shape[0])
    mask[:n] = allowed[:n]
    row.masked_fill_(~torch.from_numpy(mask), float("-inf"))


def _truncate(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask out tokens outside each row's top-k, nucleus and min-p sets (row-wise parameters)."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab).expand_as(sorted_logits)
    drop = ranks >= top_k[:, None]
    probs = sorted_logits.softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    drop |= probs < (min_p[:, None] * probs[:, :1])
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class Sampler:
    def __init__(self, seed: int):
        self.default_generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[SampleRequest]) -> list[SampleResult]:
        logits = logits.float()
        for row, req in zip(logits, requests):
            _apply_penalties(row, req)
            if req.banned_ids:
                row[torch.tensor(req.banned_ids, dtype=torch.long)] = float("-inf")
            if req.constraint is not None:
                _apply_constraint(row, req.constraint)

        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, r in enumerate(requests) if not r.params.greedy]
        if random_rows:
            idx = torch.tensor(random_rows)
            params = [requests[i].params for i in random_rows]
            scaled = logits[idx] / torch.tensor([p.temperature for p in params])[:, None]
            vocab = logits.shape[-1]
            if any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params):
                scaled = _truncate(
                    scaled,
                    torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params]),
                    torch.tensor([p.top_p for p in params]),
                    torch.tensor([p.min_p for p in params]),
                )
            probs = scaled.softmax(dim=-1)
            for j, i in enumerate(random_rows):
                # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p, using only the row's generator.
                noise = torch.empty_like(probs[j]).exponential_(generator=requests[i].generator or self.default_generator)
                tokens[i] = (probs[j] / noise).argmax()

        results = []
        want_logprobs = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
        logprobs = logits[want_logprobs].log_softmax(dim=-1) if want_logprobs else None
        token_list = tokens.tolist()
        lp_rows = {i: k for k, i in enumerate(want_logprobs)}
        for i, req in enumerate(requests):
            result = SampleResult(token_list[i])
            if i in lp_rows:
                row = logprobs[lp_rows[i]]
                result.logprob = float(row[token_list[i]])
                result.top_logprobs = []
                if req.params.logprobs:
                    values, ids = row.topk(req.params.logprobs)
                    result.top_logprobs = list(zip(ids.tolist(), values.tolist()))
            results.append(result)
        return results
