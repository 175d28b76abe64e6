"""OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`),
served as chat completions (adapted_api.py).

A request's `input` (a string, or a list of messages, function calls and their outputs) and `instructions`
become chat messages; `previous_response_id` puts the stored conversation of that response first (its
instructions are not carried over, as OpenAI does). The answer becomes a response object, or the typed event
stream (`response.created` ... `response.completed`, each with its `sequence_number`). With `store` (true unless
false) the response is kept under the tenant's name (response_store.py).

A streamed response can be cancelled while it runs, on the replica serving it: its stream ends with the
response as it stands, `cancelled`, and the generation is stopped.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from .adapted_api import chat_body, json_body, refuse, sse, tool_call_arguments, unsupported, usage_counts
from .errors import GatewayError
from .response_store import ResponseStore, not_found

# Fields taken as OpenAI defines them; any other field is refused by name (a null is "not given", as OpenAI's).
_PASSED = ("temperature", "top_p", "parallel_tool_calls", "user")
_ACCEPTED = frozenset({"model", "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "stream",
                       "store", "previous_response_id", "metadata", "truncation", "background", "include",
                       "reasoning", "service_tier", "stream_options", *_PASSED})
# The chat field each Responses field becomes, backwards: what an error about one names.
_CHAT_FIELDS = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "developer"}


class ResponsesAdapter:
    def __init__(self, store: ResponseStore, tenant_of: Callable[[], str],
                 running: dict[tuple[str, str], ResponsesAdapter]) -> None:
        self._store = store
        self._tenant_of = tenant_of  # known once the key is checked, after this is made
        self._running = running
        self.id = f"resp_{uuid.uuid4().hex}"
        self._request: dict[str, Any] = {}
        self._messages: list[dict[str, Any]] = []  # the conversation sent upstream, instructions aside
        self._store_it = True
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # items of the stream, in order
        self._text_item: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its function_call item
        self._finish: str | None = None
        self._usage: Any = None
        self._created = int(time.time())
        self._cancelled = False
        self._stream_started = False

    # -- the request ----------------------------------------------------------------------------------------
    async def chat_body(self, body: bytes) -> bytes:
        request = json_body(body)
        for name, value in request.items():
            if name not in _ACCEPTED and value is not None:
                raise unsupported(name)
        given = {k: v for k, v in request.items() if v is not None}
        self._request = given
        if given.get("background") is True:
            raise unsupported("background", " (true)")
        if given.get("include"):
            raise unsupported("include")
        if given.get("reasoning"):
            raise unsupported("reasoning")
        if given.get("truncation", "disabled") != "disabled":
            raise unsupported("truncation", f" ({given['truncation']!r})")
        store = given.get("store", True)
        if not isinstance(store, bool):
            raise refuse("store", "store must be a boolean")
        self._store_it = store
        messages: list[dict[str, Any]] = []
        previous = given.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                raise refuse("previous_response_id", "previous_response_id must be a string")
            record = await self._store.get(self._tenant_of(), previous)
            if record is None:
                raise not_found(previous, param="previous_response_id")
            messages.extend(record["messages"])
        if "input" not in given:
            raise refuse("input", "input is required: a string or a list of input items", code="missing_required_parameter")
        messages.extend(_input_messages(given["input"]))
        self._messages = messages
        chat: dict[str, Any] = {"model": given.get("model"), "messages": list(messages)}
        instructions = given.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise refuse("instructions", "instructions must be a string")
            chat["messages"].insert(0, {"role": "system", "content": instructions})
        for name in _PASSED:
            if name in given:
                chat[name] = given[name]
        if "max_output_tokens" in given:
            chat["max_tokens"] = given["max_output_tokens"]
        if "tools" in given:
            chat["tools"] = _tools(given["tools"])
        if "tool_choice" in given:
            chat["tool_choice"] = _tool_choice(given["tool_choice"])
        if (response_format := _response_format(given.get("text"))) is not None:
            chat["response_format"] = response_format
        return chat_body(chat, given)

    # -- a whole answer -------------------------------------------------------------------------------------
    async def answer(self, chat: dict[str, Any]) -> bytes:
        choice = chat["choices"][0]
        message = choice.get("message") or {}
        self._usage = chat.get("usage")
        self._finish = choice.get("finish_reason")
        content = message.get("content")
        if isinstance(content, str) and content:
            self._output.append(_message_item(f"msg_{uuid.uuid4().hex}", content, "completed"))
        for call in message.get("tool_calls") or []:
            call_id, name, arguments = tool_call_arguments(call)
            self._output.append(_call_item(call_id, name, arguments, "completed"))
        response = self._response(_status(self._finish))
        await self._keep(response)
        return json.dumps(response).encode()

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        # A chat field the gateway or the runtime refused is named as this request spelt it.
        param = error.get("param")
        if isinstance(param, str):
            head, dot, rest = param.partition(".")
            head, bracket, index = head.partition("[")
            if head in _CHAT_FIELDS:
                error = {**error, "param": _CHAT_FIELDS[head] + (bracket + index if head != "messages" else "")
                         + dot + rest}
        return json.dumps({"error": error}).encode()

    # -- a stream -------------------------------------------------------------------------------------------
    async def events(self, chunk: dict[str, Any]) -> bytes:
        out = [self._begin()]
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                out.append(self._text(delta["content"]))
            for call in delta.get("tool_calls") or []:
                out.append(self._call(call))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return b"".join(out)

    async def end(self) -> bytes:
        out = [self._begin(), self._close_text()]
        for item in self._calls.values():
            out.append(self._close_call(item))
        self._calls.clear()
        status = "cancelled" if self._cancelled else _status(self._finish)
        response = self._response(status)
        await self._keep(response)
        self.close()
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(status, "response.failed")
        if status == "cancelled":
            kind = "response.completed"  # the SDKs know no event for it; the response inside says cancelled
        out.append(self._event(kind, response=response))
        return b"".join(out)

    def stream_error(self, error: dict[str, Any]) -> bytes:
        self.close()
        message, code = str(error.get("message", "")), error.get("code")
        response = self._response("failed")
        response["error"] = {"code": code or "server_error", "message": message}
        return self._begin() + self._event("error", code=code, message=message, param=error.get("param")) \
            + self._event("response.failed", response=response)

    @property
    def stopped(self) -> bool:
        return self._cancelled

    def close(self) -> None:
        self._running.pop((self._tenant_of(), self.id), None)

    async def cancel(self) -> dict[str, Any]:
        """Stop this running response; what it has made so far is kept as `cancelled`."""
        self._cancelled = True
        response = self._response("cancelled")
        await self._keep(response)
        return response

    def _begin(self) -> bytes:
        if self._stream_started:
            return b""
        self._stream_started = True
        self._running[(self._tenant_of(), self.id)] = self
        response = self._response("in_progress")
        return self._event("response.created", response=response) + self._event("response.in_progress",
                                                                                 response=response)

    def _text(self, delta: str) -> bytes:
        out = b""
        if self._text_item is None:
            item = self._text_item = _message_item(f"msg_{uuid.uuid4().hex}", "", "in_progress")
            self._output.append(item)
            out += self._event("response.output_item.added", output_index=self._index(item), item=_copy(item))
            out += self._event("response.content_part.added", item_id=item["id"], output_index=self._index(item),
                               content_index=0, part={"type": "output_text", "text": "", "annotations": []})
        item = self._text_item
        item["content"][0]["text"] += delta
        return out + self._event("response.output_text.delta", item_id=item["id"], output_index=self._index(item),
                                 content_index=0, delta=delta, logprobs=[])

    def _close_text(self) -> bytes:
        item, self._text_item = self._text_item, None
        if item is None:
            return b""
        item["status"] = "completed"
        index, part = self._index(item), item["content"][0]
        return (self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                            text=part["text"], logprobs=[])
                + self._event("response.content_part.done", item_id=item["id"], output_index=index,
                              content_index=0, part=_copy(part))
                + self._event("response.output_item.done", output_index=index, item=_copy(item)))

    def _call(self, call: dict[str, Any]) -> bytes:
        index = call.get("index", 0)
        call_id, name, arguments = tool_call_arguments(call)
        out = b""
        item = self._calls.get(index)
        if item is None:
            out += self._close_text()
            item = self._calls[index] = _call_item(call_id or f"call_{uuid.uuid4().hex[:24]}", name, "", "in_progress")
            self._output.append(item)
            out += self._event("response.output_item.added", output_index=self._index(item), item=_copy(item))
        elif name and not item["name"]:
            item["name"] = name
        if arguments:
            item["arguments"] += arguments
            out += self._event("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=self._index(item), delta=arguments)
        return out

    def _close_call(self, item: dict[str, Any]) -> bytes:
        item["status"] = "completed"
        index = self._index(item)
        return (self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=item["name"], arguments=item["arguments"])
                + self._event("response.output_item.done", output_index=index, item=_copy(item)))

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, candidate in enumerate(self._output) if candidate is item)

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._seq += 1
        return sse(kind, {"type": kind, "sequence_number": self._seq - 1, **fields})

    # -- the response object --------------------------------------------------------------------------------
    def _response(self, status: str) -> dict[str, Any]:
        request = self._request
        prompt, completion = usage_counts(self._usage)
        text_format = (request.get("text") or {}).get("format") or {"type": "text"}
        return {
            "id": self.id, "object": "response", "created_at": self._created, "status": status,
            "model": request.get("model"), "output": _copy(self._output),
            "instructions": request.get("instructions"), "previous_response_id": request.get("previous_response_id"),
            "max_output_tokens": request.get("max_output_tokens"), "temperature": request.get("temperature"),
            "top_p": request.get("top_p"), "tools": request.get("tools", []),
            "tool_choice": request.get("tool_choice", "auto"),
            "parallel_tool_calls": request.get("parallel_tool_calls", True), "text": {"format": text_format},
            "truncation": "disabled", "store": self._store_it, "metadata": request.get("metadata", {}),
            "user": request.get("user"), "error": None, "background": False,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "usage": None if self._usage is None else {
                "input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion,
                "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
        }

    async def _keep(self, response: dict[str, Any]) -> None:
        if not self._store_it:
            return
        messages = [*self._messages, *_output_messages(response["output"])]
        await self._store.put(self._tenant_of(), self.id, {"response": response, "messages": messages})


def _status(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _input_messages(given: Any) -> list[dict[str, Any]]:
    """Chat messages for a Responses `input`."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise refuse("input", "input must be a string or a non-empty list of input items")
    messages: list[dict[str, Any]] = []
    for n, item in enumerate(given):
        param = f"input[{n}]"
        if not isinstance(item, dict):
            raise refuse(param, f"{param} must be an object")
        kind = item.get("type") or "message"
        if kind == "message":
            role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise refuse(f"{param}.role", f"{param}.role must be one of {sorted(_ROLES)}")
            messages.append({"role": role, "content": _content_text(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", param), "type": "function",
                    "function": {"name": _string(item, "name", param), "arguments": _string(item, "arguments", param)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # calls made in one turn stay one assistant message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content_text(output, f"{param}.output")
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", param), "content": text})
        elif kind == "reasoning":
            continue  # a reasoning model's notes: nothing a chat prompt takes
        else:
            raise unsupported(f"{param}.type", f" {kind!r}")
    return messages


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise refuse(param, f"{param} must be a string or a list of text parts")
    texts = []
    for n, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise unsupported(f"{param}[{n}]", f" of type {kind!r} (only text is)")
        if not isinstance(part.get("text"), str):
            raise refuse(f"{param}[{n}].text", f"{param}[{n}].text must be a string")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: dict[str, Any], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise refuse(f"{param}.{name}", f"{param}.{name} must be a string")
    return value


def _output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of a response's output, for a follow-up to continue from."""
    messages: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "message":
            messages.append({"role": "assistant", "content": "".join(p["text"] for p in item["content"])})
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    return messages


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise refuse("tools", "tools must be a list")
    out = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise unsupported(f"tools[{n}]", f" of type {kind!r} (only function tools are)")
        function = {"name": tool.get("name")}
        for name in ("description", "parameters", "strict"):
            if tool.get(name) is not None:
                function[name] = tool[name]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise unsupported("tool_choice", f" {json.dumps(choice)}")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise refuse("text", "text must be an object")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict):
        raise refuse("text.format", "text.format must be an object")
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {"name": fmt.get("name"), "schema": fmt.get("schema")}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        if fmt.get("description") is not None:
            schema["description"] = fmt["description"]
        return {"type": "json_schema", "json_schema": schema}
    raise unsupported("text.format.type", f" {fmt.get('type')!r}")


async def stored(store: ResponseStore, tenant: str, response_id: str) -> dict[str, Any]:
    """`GET /v1/responses/{id}`."""
    record = await store.get(tenant, response_id)
    if record is None:
        raise not_found(response_id)
    return record["response"]


async def delete(store: ResponseStore, tenant: str, response_id: str) -> dict[str, Any]:
    """`DELETE /v1/responses/{id}`."""
    if not await store.delete(tenant, response_id):
        raise not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


async def cancel(store: ResponseStore, running: dict[tuple[str, str], ResponsesAdapter], tenant: str,
                 response_id: str) -> dict[str, Any]:
    """`POST /v1/responses/{id}/cancel`: a response still running on this replica is stopped."""
    adapter = running.get((tenant, response_id))
    if adapter is not None:
        return await adapter.cancel()
    response = await stored(store, tenant, response_id)
    if response["status"] == "cancelled":
        return response
    raise GatewayError(400, f"Response '{response_id}' is {response['status']}: only a response still being "
                            "streamed can be cancelled", code="response_not_cancellable")
