"""What the gateway needs from an OpenAI request body: model, stream, cost fields, prompt sizes, a prefix key.

The fields that decide what a request costs (max tokens under both names, n, the prompt count, ignore_eos)
are read by `sluice_contracts.request_cost`, the reading the runtime generates from, never here.

The gateway cannot tokenize, so it brackets each prompt's length in tokens instead of guessing it:
- `upper`: what reservations use. One token per UTF-8 byte of every string the body carries, keys included
  (no tokenizer makes a token of less than a byte), whichever field it is in, except the fields that never
  reach a prompt (`NOT_PROMPT_FIELDS`, and top-level numbers, booleans and nulls); plus `TEMPLATE_TOKENS_PER_ELEMENT` for every array element and object
  member (what a template writes around and between them), and for a chat request
  `TEMPLATE_TOKENS_PER_MESSAGE` per message and `TEMPLATE_TOKENS_PER_CHAT` once (role markers, a default
  system prompt, the tools' preamble). Counting everything but the known settings closes the class: a field
  the gateway has never heard of is counted too. For a list of prompts each prompt counts its own text, and
  every other counted string of the body as well.
- `lower`: one token per `MAX_CHARS_PER_TOKEN` characters of the text certainly in the prompt; what
  context-length refusals use, so the gateway refuses only a prompt that cannot fit whatever the tokenizer.
Token-id prompts are counted exactly. The gateway sends `upper` to the runtime in the header of
`sluice_contracts.prompt_reservation`, and the runtime refuses a prompt whose real token count exceeds it.

A body is also bounded in its number of elements (`MAX_BODY_ELEMENTS`), and one larger than
`OFF_LOOP_BYTES` is parsed and measured in a separate process, so a heavy body does not stall the event loop.
"""
from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import pydantic_core

from sluice_contracts.json_depth import MAX_JSON_DEPTH
from sluice_contracts.model_tasks import Task
from sluice_contracts.request_cost import InvalidCostField, RequestCost, read_request_cost

from .errors import GatewayError

# Longer than any vocabulary entry we know of (SmolLM2's longest is 81 characters of whitespace).
MAX_CHARS_PER_TOKEN = 256
# Top-level settings the runtime reads as parameters, never as prompt text: their strings are not counted.
NOT_PROMPT_FIELDS = frozenset({"model", "user", "stop", "stream_options", "priority", "service_tier"})
# What a template writes around each array element and object member (separators, quotes, a newline).
TEMPLATE_TOKENS_PER_ELEMENT = 4
# Role markers around each chat message.
TEMPLATE_TOKENS_PER_MESSAGE = 8
# Once per chat request: a template's default system prompt, the runtime's preamble for tools.
TEMPLATE_TOKENS_PER_CHAT = 160
# Array elements and object members in one body, nested ones included: far above any real request (2,048
# embedding inputs, a long prompt as token ids), far below what takes the gateway long to walk.
MAX_BODY_ELEMENTS = 1 << 19
# Bodies above this are parsed, walked and measured in the parser process (the runtime's threshold for its thread).
OFF_LOOP_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class PromptSize:
    lower: int  # the prompt has at least this many tokens
    upper: int  # and at most this many


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

    @property
    def reserved_prompt_tokens(self) -> int:
        """The prompt tokens the reservation covers, all prompts together (what the runtime verifies)."""
        return sum(prompt.upper for prompt in self.prompts)


@dataclass(frozen=True, slots=True)
class Serialised:
    """A top-level value of a large body, kept as the JSON text the parser process wrote: the gateway never
    reads inside one, and writing it out again is a copy."""

    json: str


async def parse_request_off_loop(body: bytes, *, kind: Task, prefix_chars: int) -> ParsedRequest:
    """`parse_request`; a large body in the parser process, so that building its objects (which holds the
    interpreter's lock throughout) never stalls this process's event loop. Its arrays and objects come back
    as `Serialised` text."""
    if len(body) <= OFF_LOOP_BYTES:
        return parse_request(body, kind=kind, prefix_chars=prefix_chars)
    try:
        result = await asyncio.get_running_loop().run_in_executor(_parser(), _parse_compact, body, kind, prefix_chars)
    except BrokenProcessPool:
        stop_parser()
        raise GatewayError(503, "the gateway could not read this request body; try again",
                           code="parser_unavailable", headers=[(b"retry-after", b"1")]) from None
    if isinstance(result, tuple):
        status, message, code, param = result
        raise GatewayError(status, message, code=code, param=param)
    return result


def serialise(payload: dict[str, Any]) -> bytes:
    """The body as sent upstream."""
    if not any(isinstance(value, Serialised) for value in payload.values()):
        return json.dumps(payload, separators=(",", ":")).encode()
    members = (f"{json.dumps(key)}:{value.json if isinstance(value, Serialised) else json.dumps(value)}"
               for key, value in payload.items())
    return ("{" + ",".join(members) + "}").encode()


def warm_parser() -> None:
    """Start the parser process now, so the first large body does not wait for it."""
    _parser().submit(int)


_pool: ProcessPoolExecutor | None = None


def _parser() -> ProcessPoolExecutor:
    # One process: heavy bodies wait for each other, never for the event loop, and never take every core.
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    return _pool


def stop_parser() -> None:
    """Stop the parser process (a later large body starts another)."""
    global _pool
    pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


def _parse_compact(body: bytes, kind: Task, prefix_chars: int) -> ParsedRequest | tuple:
    """In the parser process: the request with its containers as text, or the error's fields to raise."""
    try:
        parsed = parse_request(body, kind=kind, prefix_chars=prefix_chars)
    except GatewayError as err:
        return err.status, err.message, err.code, err.param
    parsed.payload = {key: Serialised(json.dumps(value, separators=(",", ":")))
                      if isinstance(value, (dict, list)) else value for key, value in parsed.payload.items()}
    return parsed


def parse_request(body: bytes, *, kind: Task, prefix_chars: int) -> ParsedRequest:
    """`kind` is the task (sluice_contracts.model_tasks); raises GatewayError(400) for malformed bodies."""
    payload = _json_object(body)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(400, "you must provide a model parameter", param="model", code="missing_model")
    stream = payload.get("stream") is True
    options = payload.get("stream_options")
    client_wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    if kind == "chat":
        prompt_param = "messages"
        texts, prompts = _chat_prompt(payload)
    elif kind == "rerank":
        prompt_param = "documents"
        texts, prompts = _rerank_prompts(payload, _extra_tokens(payload, ("query", "documents")))
    else:
        prompt_param = "prompt" if kind == "completion" else "input"
        texts, prompts = _listed_prompts(payload.get(prompt_param), prompt_param,
                                         _extra_tokens(payload, (prompt_param,)))
    try:
        cost = read_request_cost(payload, kind)
    except InvalidCostField as exc:
        raise GatewayError(400, str(exc), param=exc.param, code="invalid_value") from None
    prefix = "\x1e".join(texts)[:prefix_chars].encode()
    return ParsedRequest(kind, payload, model, stream, client_wants_usage, cost, tuple(prompts), prompt_param, prefix)


_TOO_DEEP = f"it is nested too deeply (more than {MAX_JSON_DEPTH} levels of arrays and objects)"
_TOO_MANY = f"it has more than {MAX_BODY_ELEMENTS} array elements and object members"


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
    _check_shape(payload)
    return payload


def _check_shape(payload: dict[str, Any]) -> None:
    """Nesting at most MAX_JSON_DEPTH levels (the top object the first), at most MAX_BODY_ELEMENTS elements."""
    stack: list[tuple[Any, int]] = [(payload, 1)]
    elements = 0
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise GatewayError(400, f"request body is not valid JSON: {_TOO_DEEP}", code="invalid_json")
        children = item.values() if isinstance(item, dict) else item
        elements += len(item)
        if elements > MAX_BODY_ELEMENTS:
            raise GatewayError(400, f"request body is too large: {_TOO_MANY}", code="invalid_json")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def _tokens_at_most(value: Any) -> int:
    """The upper bound of what `value` can add to a prompt: its strings' UTF-8 bytes (keys included) and the
    per-element allowance; no recursion (the shape was checked)."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += _utf8_bytes(item)
        elif isinstance(item, dict):
            total += TEMPLATE_TOKENS_PER_ELEMENT * len(item)
            for key, child in item.items():
                total += _utf8_bytes(key)
                stack.append(child)
        elif isinstance(item, list):
            total += TEMPLATE_TOKENS_PER_ELEMENT * len(item)
            stack.extend(item)
    return total


def _utf8_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="surrogatepass"))


def _extra_tokens(payload: dict[str, Any], prompt_fields: tuple[str, ...]) -> int:
    """What every field except the prompt's own and the settings may add to each prompt."""
    skipped = NOT_PROMPT_FIELDS.union(prompt_fields)
    return sum(_utf8_bytes(key) + TEMPLATE_TOKENS_PER_ELEMENT + _tokens_at_most(value)
               for key, value in payload.items() if key not in skipped and isinstance(value, (str, list, dict)))


def _chat_prompt(payload: dict[str, Any]) -> tuple[list[str], list[PromptSize]]:
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError(400, "messages must be a non-empty array", param="messages")
    texts = [_message_text(m) for m in messages]
    lower = math.ceil(sum(len(text) for text in texts) / MAX_CHARS_PER_TOKEN)
    upper = (_tokens_at_most(messages) + _extra_tokens(payload, ("messages",))
             + TEMPLATE_TOKENS_PER_MESSAGE * len(messages) + TEMPLATE_TOKENS_PER_CHAT)
    return texts, [PromptSize(lower, upper)]


def _message_text(message: Any) -> str:
    """The message's own text (certainly in the prompt); what the prefix key and the lower bound read."""
    if not isinstance(message, dict):
        raise GatewayError(400, "each message must be an object with role and content", param="messages")
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _text_size(text: str, extra: int) -> PromptSize:
    return PromptSize(math.ceil(len(text) / MAX_CHARS_PER_TOKEN),
                      _utf8_bytes(text) + TEMPLATE_TOKENS_PER_ELEMENT + extra)


def _listed_prompts(prompt: Any, field: str, extra: int) -> tuple[list[str], list[PromptSize]]:
    """Text used for the prefix key, and the size of each prompt; token-id prompts count exactly."""
    if isinstance(prompt, str):
        return [prompt], [_text_size(prompt, extra)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return prompt, [_text_size(p, extra) for p in prompt]
        if all(_is_token_id(p) for p in prompt):
            return [",".join(map(str, prompt))], [PromptSize(len(prompt), len(prompt) + extra)]
        if all(isinstance(p, list) and p and all(_is_token_id(t) for t in p) for p in prompt):
            return [",".join(map(str, p)) for p in prompt], [PromptSize(len(p), len(p) + extra) for p in prompt]
    raise GatewayError(400, f"{field} must be a string, an array of strings or of token ids", param=field)


def _rerank_prompts(payload: dict[str, Any], extra: int) -> tuple[list[str], list[PromptSize]]:
    """The query, then each document: each is embedded on its own."""
    query, documents = payload.get("query"), payload.get("documents")
    if not isinstance(query, str):
        raise GatewayError(400, "query must be a string", param="query")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise GatewayError(400, "documents must be a non-empty array of strings", param="documents")
    texts = [query, *documents]
    return texts, [_text_size(text, extra) for text in texts]


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
