"""Anthropic's Messages API (`POST /v1/messages`), served as chat completions (adapted_api.py).

`system`, text and tool-use/tool-result blocks become chat messages, `tools` function tools, `stop_sequences`
`stop`; the answer becomes a message with text and tool_use blocks, or Anthropic's event stream
(message_start, content_block_start/delta/stop, message_delta, message_stop). Every error on this path, the
gateway's own (auth, limits) included, is in Anthropic's shape: {"type": "error", "error": {"type", "message"}}.
The key comes in `x-api-key` or `Authorization: Bearer` (app.py).
"""
from __future__ import annotations

import json
import uuid
from typing import Any

from .adapted_api import chat_body, json_body, refuse, sse, tool_call_arguments, unsupported, usage_counts

_PASSED = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "stop_sequences": "stop"}
_ACCEPTED = frozenset({"model", "messages", "system", "max_tokens", "stream", "tools", "tool_choice", "metadata",
                       "service_tier", *_PASSED})
# Anthropic's error types by status (its API's own list).
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                529: "overloaded_error"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


class MessagesAdapter:
    def __init__(self) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self._model: Any = None
        self._started = False
        self._block: tuple[str, int] | None = None  # the open content block: ("text", -1) or ("tool", chat index)
        self._index = -1
        self._finish: str | None = None
        self._usage: Any = None

    async def chat_body(self, body: bytes) -> bytes:
        request = json_body(body)
        for name, value in request.items():
            if name not in _ACCEPTED and value is not None:
                raise unsupported(name)
        given = {k: v for k, v in request.items() if v is not None}
        self._model = given.get("model")
        if "max_tokens" not in given:
            raise refuse("max_tokens", "max_tokens: Field required", code="missing_required_parameter")
        messages = []
        if "system" in given:
            messages.append({"role": "system", "content": _text(given["system"], "system")})
        if not isinstance(given.get("messages"), list) or not given["messages"]:
            raise refuse("messages", "messages must be a non-empty list")
        for n, message in enumerate(given["messages"]):
            messages.extend(_chat_messages(message, f"messages[{n}]"))
        chat: dict[str, Any] = {"model": self._model, "messages": messages, "max_tokens": given["max_tokens"]}
        for name, chat_name in _PASSED.items():
            if name in given:
                chat[chat_name] = given[name]
        if "tools" in given:
            chat["tools"] = _tools(given["tools"])
        if "tool_choice" in given:
            chat.update(_tool_choice(given["tool_choice"]))
        if isinstance(given.get("metadata"), dict) and isinstance(given["metadata"].get("user_id"), str):
            chat["user"] = given["metadata"]["user_id"]
        return chat_body(chat, given)

    async def answer(self, chat: dict[str, Any]) -> bytes:
        choice = chat["choices"][0]
        message = choice.get("message") or {}
        content: list[dict[str, Any]] = []
        if isinstance(message.get("content"), str) and message["content"]:
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            call_id, name, arguments = tool_call_arguments(call)
            content.append({"type": "tool_use", "id": call_id, "name": name, "input": _arguments(arguments)})
        self._finish, self._usage = choice.get("finish_reason"), chat.get("usage")
        prompt, completion = usage_counts(self._usage)
        stop_reason, stop_sequence = self._stop()
        return json.dumps({"id": self.id, "type": "message", "role": "assistant", "model": self._model,
                           "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                           "usage": {"input_tokens": prompt, "output_tokens": completion}}).encode()

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        return json.dumps({"type": "error", "error": {"type": error_type(status), "message": error["message"]}}).encode()

    async def events(self, chunk: dict[str, Any]) -> bytes:
        out = [self._begin()]
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                out.append(self._open(("text", -1), {"type": "text", "text": ""}))
                out.append(sse("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                       "delta": {"type": "text_delta", "text": delta["content"]}}))
            for call in delta.get("tool_calls") or []:
                call_id, name, arguments = tool_call_arguments(call)
                block = ("tool", call.get("index", 0))
                if self._block != block:
                    out.append(self._open(block, {"type": "tool_use", "id": call_id or f"toolu_{uuid.uuid4().hex[:24]}",
                                                  "name": name, "input": {}}))
                if arguments:
                    out.append(sse("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                           "delta": {"type": "input_json_delta",
                                                                     "partial_json": arguments}}))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return b"".join(out)

    async def end(self) -> bytes:
        stop_reason, stop_sequence = self._stop()
        prompt, completion = usage_counts(self._usage)
        return b"".join([
            self._begin(), self._close(),
            sse("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                  "usage": {"input_tokens": prompt, "output_tokens": completion}}),
            sse("message_stop", {"type": "message_stop"}),
        ])

    def stream_error(self, error: dict[str, Any]) -> bytes:
        status = {"rate_limit_error": 429, "service_unavailable": 503}.get(str(error.get("type")), 500)
        return sse("error", {"type": "error", "error": {"type": error_type(status), "message": str(error.get("message"))}})

    @property
    def stopped(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def _begin(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return sse("message_start", {"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self._model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}})

    def _open(self, block: tuple[str, int], content_block: dict[str, Any]) -> bytes:
        if self._block == block:
            return b""
        out = self._close()
        self._block = block
        self._index += 1
        return out + sse("content_block_start", {"type": "content_block_start", "index": self._index,
                                                 "content_block": content_block})

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        return sse("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _stop(self) -> tuple[str, None]:
        """Anthropic's stop reason. A chat answer does not say whether a stop sequence or the model's end of turn
        stopped it, so both are `end_turn`, with no `stop_sequence`."""
        return _STOP_REASONS.get(self._finish or "stop", "end_turn"), None


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for n, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                raise unsupported(f"{param}[{n}]", f" of type {kind!r} (only text is)")
            texts.append(block["text"])
        return "".join(texts)
    raise refuse(param, f"{param} must be a string or a list of text blocks")


def _chat_messages(message: Any, param: str) -> list[dict[str, Any]]:
    """The chat messages of one Anthropic message: tool results become tool messages of their own."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise refuse(f"{param}.role", f"{param}.role must be 'user' or 'assistant'")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise refuse(f"{param}.content", f"{param}.content must be a string or a list of content blocks")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for n, block in enumerate(content):
        where = f"{param}.content[{n}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": str(block.get("id")), "type": "function", "function": {
                "name": str(block.get("name")), "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            text = result if isinstance(result, str) else _text(result, f"{where}.content")
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id")), "content": text})
        else:
            raise unsupported(where, f" of type {kind!r} in a {role} message")
    if role == "assistant":
        out.append({"role": "assistant", "content": "".join(texts) or None, **({"tool_calls": calls} if calls else {})})
    elif texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise refuse("tools", "tools must be a list")
    out = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            raise unsupported(f"tools[{n}]", " (only custom tools with an input_schema are)")
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    out: dict[str, Any]
    if kind == "auto":
        out = {"tool_choice": "auto"}
    elif kind == "any":
        out = {"tool_choice": "required"}
    elif kind == "none":
        out = {"tool_choice": "none"}
    elif kind == "tool":
        out = {"tool_choice": {"type": "function", "function": {"name": choice.get("name")}}}
    else:
        raise refuse("tool_choice", "tool_choice.type must be one of auto, any, tool, none")
    if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def _arguments(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except ValueError:
        return {"arguments": arguments}
