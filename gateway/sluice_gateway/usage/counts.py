"""The cells usage is counted in, and what one request adds to them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..admission import is_count, used_tokens

BUCKET_S = 3600
# How long counts are kept: a year and a bit, so last year's same month can still be read.
KEPT_S = 400 * 24 * 3600
KINDS = ("requests", "prompt_tokens", "completion_tokens", "unmetered_requests")


@dataclass(frozen=True, slots=True)
class Cell:
    hour: int  # the bucket's start, unix seconds
    tenant: str
    model: str
    mode: str  # "online" or "batch"
    kind: str  # one of KINDS


def hour_of(unix_s: float) -> int:
    return int(unix_s) // BUCKET_S * BUCKET_S


def request_counts(prompt_tokens: Any, completion_tokens: Any, status: int, admitted: bool) -> dict[str, int]:
    """What one request adds, by kind, read as the token limit settles it (`used_tokens`): its reported usage;
    nothing for a refusal; one unmetered request when the usage is unknown and it had been admitted."""
    used = used_tokens(prompt_tokens, completion_tokens, status)
    if used is None:
        return {"unmetered_requests": 1} if admitted else {}
    if is_count(prompt_tokens):
        return {"requests": 1, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens or 0}
    return {}
