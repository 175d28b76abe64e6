"""What the gateway needs from an OpenAI request body: model, stream, a token estimate, a prefix key."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .errors import GatewayError

# Roughly four characters per token for English text, plus a few tokens of chat-template framing per message.
_CHARS_PER_TOKEN = 4
_TOKENS_PER_MESSAGE = 4


@dataclass(slots=True)
class ParsedRequest:
    payload: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool
    estimated_tokens: int
    prefix: bytes


def parse_request(body: bytes, *, kind: str, default_max_tokens: int, prefix_chars: int) -> ParsedRequest:
    """`kind` is "chat", "completion" or "embedding"; raises GatewayError(400) for malformed bodies."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise GatewayError(400, "request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(400, "you must provide a model parameter", param="model", code="missing_model")
    stream = payload.get("stream") is True
    options = payload.get("stream_options")
    client_wants_usage = isinstance(options, dict) and options.get("include_usage") is True

    if kind == "chat":
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise GatewayError(400, "messages must be a non-empty array", param="messages")
        texts = [_message_text(m) for m in messages]
        prompt_tokens = sum(_text_tokens(t) + _TOKENS_PER_MESSAGE for t in texts)
        if "tools" in payload:
            prompt_tokens += _text_tokens(json.dumps(payload["tools"]))
    else:
        field = "prompt" if kind == "completion" else "input"
        parts = _prompt_parts(payload.get(field), field)
        texts = [text for text, _ in parts]
        prompt_tokens = sum(tokens for _, tokens in parts)

    if kind == "embedding":
        output_tokens = 0
    else:
        limit = payload.get("max_completion_tokens", payload.get("max_tokens"))
        if limit is None:
            limit = default_max_tokens
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise GatewayError(400, "max_tokens must be a non-negative integer", param="max_tokens")
        choices = payload.get("n", 1)
        output_tokens = limit * (choices if isinstance(choices, int) and choices > 0 else 1)

    prefix = "\x1e".join(texts)[:prefix_chars].encode()
    return ParsedRequest(payload, model, stream, client_wants_usage, prompt_tokens + output_tokens, prefix)


def _text_tokens(text: str) -> int:
    return math.ceil(len(text) / _CHARS_PER_TOKEN)


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


def _prompt_parts(prompt: Any, field: str) -> list[tuple[str, int]]:
    """(text used for the prefix key, estimated tokens) for each prompt; token-id prompts count exactly."""
    if isinstance(prompt, str):
        return [(prompt, _text_tokens(prompt))]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [(p, _text_tokens(p)) for p in prompt]
        if all(isinstance(p, int) for p in prompt):
            return [(",".join(map(str, prompt)), len(prompt))]
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            return [(",".join(map(str, p)), len(p)) for p in prompt]
    raise GatewayError(400, f"{field} must be a string, an array of strings or of token ids", param=field)
