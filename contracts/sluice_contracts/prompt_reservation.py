"""The prompt tokens the gateway reserved for a request, which the runtime verifies.

The gateway estimates a prompt's size before it forwards (it has no tokenizer) and reserves that many tokens
of the tenant's budget. It sends the estimate in `HEADER`, replacing any value the client sent. The runtime
tokenizes the prompt as it will serve it, and refuses a request whose real prompt tokens (per prompt, summed
over the prompts of a list) exceed the reservation: 400 with `CODE`, which the gateway passes on. So a
tenant can never be served more prompt than it was charged for, whatever field carries the text.

A request without the header (a direct caller, `make run` without a gateway) is not checked.
"""
from __future__ import annotations

import re

HEADER = "x-sluice-prompt-tokens-reserved"
CODE = "prompt_exceeds_reservation"
PARAM = "messages"
# Wider than any context a model has, narrow enough to print.
MAX_RESERVATION = 1 << 40

_DIGITS = re.compile(r"^[0-9]{1,13}$")


class InvalidReservation(ValueError):
    """The header is not a token count; the runtime refuses such a request (it came from a broken gateway)."""


def header_value(tokens: int) -> str:
    return str(min(max(int(tokens), 0), MAX_RESERVATION))


def parse_header(value: str | None) -> int | None:
    """The reserved prompt tokens, or None when the header is absent."""
    if value is None:
        return None
    text = value.strip()
    if not _DIGITS.match(text) or int(text) > MAX_RESERVATION:
        raise InvalidReservation(f"the {HEADER} header must be a token count, got {value[:40]!r}")
    return int(text)
