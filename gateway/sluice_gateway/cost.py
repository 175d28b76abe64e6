"""What a request may cost, decided before any limit is consulted: the context check and the token reservation.

Both read the request through `ParsedRequest.cost` (the reading the runtime generates from) and the context
length of the backends that may serve it (`RoutingTable.max_model_len`, the largest, as any of them may).
"""
from __future__ import annotations

from dataclasses import dataclass

from sluice_contracts.model_tasks import POOLING_TASKS

from .errors import GatewayError
from .request import ParsedRequest, PromptSize


def check_context(parsed: ParsedRequest, context: int | None) -> None:
    """Refuse (400 context_length_exceeded) a request no backend can serve, whatever the tokenizer.

    Only certain cases: the gateway knows each prompt's length only within bounds, the runtime checks exactly.
    """
    if context is None:
        return
    cost = parsed.cost
    if cost.max_tokens is not None and cost.max_tokens >= context:
        raise _too_long(
            f"This model's maximum context length is {context} tokens, but {cost.max_tokens_param} asks for "
            f"{cost.max_tokens} tokens of completion, which leaves no room for a prompt. Lower "
            f"{cost.max_tokens_param}.", cost.max_tokens_param)
    pooled = parsed.kind in POOLING_TASKS
    for prompt in parsed.prompts:
        if prompt.lower > context or (prompt.lower == context and not pooled):
            raise _too_long(
                f"This model's maximum context length is {context} tokens, but the {parsed.prompt_param} has at "
                f"least {prompt.lower} tokens. Shorten the {parsed.prompt_param}.", parsed.prompt_param)
        if cost.max_tokens is not None and prompt.lower + cost.max_tokens > context:
            raise _too_long(
                f"This model's maximum context length is {context} tokens. However, you requested at least "
                f"{prompt.lower + cost.max_tokens} tokens ({prompt.lower} or more in the {parsed.prompt_param}, "
                f"{cost.max_tokens} for the completion). Reduce the {parsed.prompt_param} or "
                f"{cost.max_tokens_param}.", cost.max_tokens_param)


def _too_long(message: str, param: str) -> GatewayError:
    return GatewayError(400, message, param=param, code="context_length_exceeded")


@dataclass(frozen=True, slots=True)
class Reservation:
    """The most tokens a request can consume, and how that shrinks if its max_tokens is lowered."""

    prompts: tuple[PromptSize, ...]
    choices: int
    max_tokens: int  # per choice; what the runtime will generate at most (to the end of the context if unset)
    context: int | None
    lowerable: bool  # a generation whose max_tokens the gateway may set (not embeddings or rerank)

    @property
    def tokens(self) -> int:
        return self.tokens_with(self.max_tokens)

    def tokens_with(self, max_tokens: int) -> int:
        """Prompt and output tokens at most, with `max_tokens` per choice."""
        return sum(self._prompt_tokens(prompt, max_tokens) for prompt in self.prompts)

    def _prompt_tokens(self, prompt: PromptSize, max_tokens: int) -> int:
        if self.context is None:
            return prompt.upper + self.choices * max_tokens
        # The runtime serves a prompt only if it leaves room for max_tokens, and no choice outgrows the context.
        longest_prompt = max(min(prompt.upper, self.context - max_tokens), prompt.lower)
        return min(longest_prompt + self.choices * max_tokens,
                   prompt.lower + self.choices * max(self.context - prompt.lower, 0))

    def max_tokens_within(self, tokens: int) -> int:
        """The largest max_tokens (at least 1) whose reservation fits in `tokens`."""
        low, high = 1, self.max_tokens
        while low < high:
            middle = (low + high + 1) // 2
            if self.tokens_with(middle) <= tokens:
                low = middle
            else:
                high = middle - 1
        return low


def reserve(parsed: ParsedRequest, context: int | None, default_max_tokens: int) -> Reservation:
    """The request's reservation; `default_max_tokens` stands in only where neither the request nor the
    routing table bounds the output (a route without `maxModelLen`)."""
    cost = parsed.cost
    if parsed.kind in POOLING_TASKS:
        return Reservation(parsed.prompts, 1, 0, context, lowerable=False)
    max_tokens = cost.max_tokens
    if max_tokens is None:
        shortest = min(prompt.lower for prompt in parsed.prompts)
        max_tokens = max(context - shortest, 1) if context is not None else default_max_tokens
    return Reservation(parsed.prompts, cost.choices, max_tokens, context, lowerable=True)
