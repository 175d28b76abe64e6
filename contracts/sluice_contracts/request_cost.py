"""The OpenAI request fields that decide what a request costs, read one way by the gateway and by the runtime.

The gateway reserves a tenant's tokens from this reading before it forwards a request, and the runtime
generates from the same reading. Two readings would let a tenant reserve little and be served much, so both
components call `read_request_cost` and neither interprets these fields on its own. Types are strict, as in
OpenAI's API: `"16"`, `16.0` and `true` are not integers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, overload

from .model_tasks import POOLING_TASKS, Task

Endpoint = Task

MAX_CHOICES = 16
# OpenAI's default for the legacy completions endpoint; chat completions generate to the end of the context.
COMPLETION_DEFAULT_MAX_TOKENS = 16
_MAX_TOKEN_FIELDS = ("max_completion_tokens", "max_tokens")


class InvalidCostField(ValueError):
    """A cost-deciding field the request cannot be served with; `param` names it for the OpenAI error body."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class RequestCost:
    prompts: int  # prompts in the request: a /v1/completions or /v1/embeddings list, /v1/rerank's documents, else 1
    choices: int  # n
    max_tokens: int | None  # per choice; None: until the end of the context
    max_tokens_param: str  # the field the client used, for error messages
    ignore_eos: bool

    def output_tokens(self, prompt_tokens: int, max_model_len: int | None) -> int | None:
        """The most tokens one prompt's choices can generate together; None when unbounded and no context is known."""
        per_choice = self.max_tokens
        if per_choice is None:
            if max_model_len is None:
                return None
            per_choice = max(max_model_len - prompt_tokens, 0)
        return per_choice * self.choices


def read_request_cost(payload: Mapping[str, Any], endpoint: Endpoint) -> RequestCost:
    """Raises InvalidCostField for a value either component would have to guess at."""
    prompts = _prompt_count(payload, endpoint)
    if endpoint in POOLING_TASKS:
        return RequestCost(prompts, 1, 0, "max_tokens", False)
    max_tokens, param = _max_tokens(payload, endpoint)
    choices = _strict_int(payload, "n", 1)
    if not 1 <= choices <= MAX_CHOICES:
        raise InvalidCostField("n", f"n must be between 1 and {MAX_CHOICES}, got {choices}.")
    ignore_eos = payload.get("ignore_eos")
    if ignore_eos is None:
        ignore_eos = False
    elif not isinstance(ignore_eos, bool):
        raise InvalidCostField("ignore_eos", f"ignore_eos must be a boolean, got {_type_name(ignore_eos)}.")
    return RequestCost(prompts, choices, max_tokens, param, ignore_eos)


def _max_tokens(payload: Mapping[str, Any], endpoint: Endpoint) -> tuple[int | None, str]:
    given = {
        name: value for name in _MAX_TOKEN_FIELDS if (value := _strict_int(payload, name, None)) is not None
    }
    if len(set(given.values())) > 1:
        raise InvalidCostField(
            "max_tokens",
            "max_tokens and max_completion_tokens are two names for one limit and differ here; send one of them.",
        )
    for name, value in given.items():
        if value < 1:
            raise InvalidCostField(name, f"{name} must be at least 1, got {value}.")
        return value, name
    return (COMPLETION_DEFAULT_MAX_TOKENS if endpoint == "completion" else None), "max_tokens"


@overload
def _strict_int(payload: Mapping[str, Any], name: str, default: int) -> int: ...
@overload
def _strict_int(payload: Mapping[str, Any], name: str, default: None) -> int | None: ...
def _strict_int(payload: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = payload.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidCostField(name, f"{name} must be an integer, got {_type_name(value)}.")
    return value


def _prompt_count(payload: Mapping[str, Any], endpoint: Endpoint) -> int:
    if endpoint == "chat":
        return 1
    if endpoint == "rerank":
        documents = payload.get("documents")
        if not isinstance(documents, list) or not documents:
            raise InvalidCostField("documents", "documents must be a non-empty array of strings.")
        return len(documents)
    field = "prompt" if endpoint == "completion" else "input"
    value = payload.get(field)
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        return len(value)
    if isinstance(value, str) or (isinstance(value, list) and value):
        return 1  # one text, or one prompt given as token ids
    raise InvalidCostField(field, f"{field} must be a string, an array of strings or of token ids.")


def _type_name(value: Any) -> str:
    return {bool: "a boolean", str: "a string", float: "a number", list: "an array", dict: "an object"}.get(
        type(value), type(value).__name__)
