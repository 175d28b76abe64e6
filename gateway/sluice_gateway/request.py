"""What the gateway needs from an OpenAI request body: model, stream, cost fields, prompt sizes, a prefix key.

The fields that decide what a request costs (max tokens under both names, n, the prompt count, ignore_eos)
are read by `sluice_contracts.request_cost`, the reading the runtime generates from, never here.

The gateway cannot tokenize, so it brackets each prompt's length in tokens instead of guessing it:
- `upper`: one token per UTF-8 byte of text (no tokenizer makes a token of less than a byte; byte-fallback
  vocabularies spend up to one per byte), plus the chat template's framing; what reservations use.
- `lower`: one token per `MAX_CHARS_PER_TOKEN` characters; what context-length refusals use, so the
  gateway refuses only a prompt that cannot fit whatever the tokenizer.
Token-id prompts are counted exactly. The runtime counts exactly in any case and the limiter settles with it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pydantic_core

from sluice_contracts.json_depth import MAX_JSON_DEPTH
from sluice_contracts.model_tasks import Task
from sluice_contracts.request_cost import InvalidCostField, RequestCost, read_request_cost

from .errors import GatewayError

# Longer than any vocabulary entry we know of (SmolLM2's longest is 81 characters of whitespace).
MAX_CHARS_PER_TOKEN = 256
# Chat templates wrap each message in a few tokens (role markers, separators); an allowance, settled later.
_TEMPLATE_TOKENS_PER_MESSAGE = 8


@dataclass(frozen=True, slots=True)
class PromptSize:
    lower: int  # the prompt has at least this many tokens
    upper: int  # and, template framing aside, at most this many


@dataclass(slots=True)
class ParsedRequest:
    kind: Task
    payload: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool
    cost: RequestCost
    prompts: tuple[PromptSize, ...]  # one per prompt (a /v1/completions or /v1/embeddings list; /v1/rerank's
    # query, then each document), else one
    prompt_param: str  # the field holding the prompt, for error messages
    prefix: bytes


def parse_request(body: bytes, *, kind: str, prefix_chars: int) -> ParsedRequest:
    """`kind` is the task (sluice_contracts.model_tasks); raises GatewayError(400) for malformed bodies."""
    payload = _json_object(body)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(400, "you must provide a model parameter", param="model", code="missing_model")
    stream = payload.get("stream") is True
    options = payload.get("stream_options")
    client_wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    if kind == "chat":
        texts, prompts = _chat_prompt(payload)
        prompt_param = "messages"
    elif kind == "rerank":
        texts, prompts = _rerank_prompts(payload)
        prompt_param = "documents"
    else:
        prompt_param = "prompt" if kind == "completion" else "input"
        texts, prompts = _listed_prompts(payload.get(prompt_param), prompt_param)
    try:
        cost = read_request_cost(payload, kind)  # type: ignore[arg-type]
    except InvalidCostField as exc:
        raise GatewayError(400, str(exc), param=exc.param, code="invalid_value") from None
    prefix = "\x1e".join(texts)[:prefix_chars].encode()
    return ParsedRequest(kind, payload, model, stream, client_wants_usage, cost, tuple(prompts), prompt_param, prefix)


_TOO_DEEP = f"it is nested too deeply (more than {MAX_JSON_DEPTH} levels of arrays and objects)"


def _json_object(body: bytes) -> dict[str, Any]:
    # pydantic-core's parser stops at 200 levels of nesting with a ValueError, where the standard library's
    # would recurse until RecursionError; the runtime's limit (the contract's) is checked after it.
    try:
        payload = pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError as exc:
        reason = _TOO_DEEP if "recursion limit" in str(exc) else str(exc)
        raise GatewayError(400, f"request body is not valid JSON: {reason}", code="invalid_json") from None
    if not isinstance(payload, dict):
        raise GatewayError(400, "request body must be a JSON object", code="invalid_json")
    # A body with fewer brackets than the limit cannot nest past it, and is not walked.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and _nesting_exceeds(payload, MAX_JSON_DEPTH):
        raise GatewayError(400, f"request body is not valid JSON: {_TOO_DEEP}", code="invalid_json")
    return payload


def _nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels deep (the top one the first); no recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _text_size(text: str, framing: int = 0) -> PromptSize:
    return PromptSize(math.ceil(len(text) / MAX_CHARS_PER_TOKEN), len(text.encode()) + framing)


def _chat_prompt(payload: dict[str, Any]) -> tuple[list[str], list[PromptSize]]:
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError(400, "messages must be a non-empty array", param="messages")
    texts = [_message_text(m) for m in messages]
    joined = "".join(texts)
    tools = payload.get("tools")
    if tools is not None:
        joined += json.dumps(tools)  # rendered into the prompt by the template
    return texts, [_text_size(joined, _TEMPLATE_TOKENS_PER_MESSAGE * len(messages))]


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        raise GatewayError(400, "each message must be an object with role and content", param="messages")
    content = message.get("content")
    role = str(message.get("role", ""))
    if isinstance(content, str):
        return f"{role}:{content}"
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return f"{role}:" + "".join(parts)
    return f"{role}:"


def _listed_prompts(prompt: Any, field: str) -> tuple[list[str], list[PromptSize]]:
    """Text used for the prefix key, and the size of each prompt; token-id prompts count exactly."""
    if isinstance(prompt, str):
        return [prompt], [_text_size(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return prompt, [_text_size(p) for p in prompt]
        if all(_is_token_id(p) for p in prompt):
            return [",".join(map(str, prompt))], [PromptSize(len(prompt), len(prompt))]
        if all(isinstance(p, list) and p and all(_is_token_id(t) for t in p) for p in prompt):
            return [",".join(map(str, p)) for p in prompt], [PromptSize(len(p), len(p)) for p in prompt]
    raise GatewayError(400, f"{field} must be a string, an array of strings or of token ids", param=field)


def _rerank_prompts(payload: dict[str, Any]) -> tuple[list[str], list[PromptSize]]:
    """The query, then each document: each is embedded on its own."""
    query, documents = payload.get("query"), payload.get("documents")
    if not isinstance(query, str):
        raise GatewayError(400, "query must be a string", param="query")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise GatewayError(400, "documents must be a non-empty array of strings", param="documents")
    texts = [query, *documents]
    return texts, [_text_size(text) for text in texts]


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
