"""The gateway's prompt-token reservation (`sluice_contracts.prompt_reservation`), verified against the prompt as
the engine will run it: rendered by the chat template and tokenized, every field that reaches the model counted.
A request without the header is a direct caller's and is not checked."""
from __future__ import annotations

from starlette.datastructures import Headers

from sluice_contracts import prompt_reservation

from .errors import invalid_request


def reserved_prompt_tokens(headers: Headers) -> int | None:
    """The reservation the request carries, or None; a malformed one is refused (only a broken gateway sends it)."""
    values = headers.getlist(prompt_reservation.HEADER)
    if len(values) > 1:
        raise invalid_request(f"The {prompt_reservation.HEADER} header must be sent once, got {len(values)} of them.",
                              code="invalid_prompt_reservation")
    try:
        return prompt_reservation.parse_header(values[0] if values else None)
    except prompt_reservation.InvalidReservation as exc:
        raise invalid_request(f"{exc}.", code="invalid_prompt_reservation") from None


def check_reservation(reserved: int | None, prompts: list[list[int]], param: str) -> None:
    """Refuses prompts whose tokens, summed over all of them, exceed `reserved`."""
    if reserved is None:
        return
    tokens = sum(len(prompt) for prompt in prompts)
    if tokens > reserved:
        what = "prompt has" if len(prompts) == 1 else f"{len(prompts)} prompts have"
        raise invalid_request(
            f"The {what} {tokens} tokens{'' if len(prompts) == 1 else ' together'}, more than the {reserved} "
            f"prompt tokens reserved for this request ({prompt_reservation.HEADER}).", param=param,
            code=prompt_reservation.CODE)
