"""Tools in the prompt and tool calls in the output.

Format (the widely used "Hermes" convention, which SmolLM2's larger siblings were trained on):
the model answers a call with one block per call,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

When the chat template renders `tools` itself, the tools go to the template. When it does not
(SmolLM2-135M's template ignores them), `tools_system_prompt` describes the tools and this
format in a system message, placed before the conversation's own system text. Assistant turns
that made calls are rendered back in the same format and tool results as `tool` turns, so a
conversation round-trips. For tool_choice "required" or a named function the output is
constrained by a grammar (see structured_output), so it is always exactly one valid call.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from . import json_limits
from .protocol import Tool

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def tool_schema(tool: Tool) -> dict:
    function = tool.function
    spec: dict = {"name": function.name}
    if function.description:
        spec["description"] = function.description
    spec["parameters"] = function.parameters or {"type": "object", "properties": {}}
    return spec


def tools_system_prompt(tools: list[Tool]) -> str:
    listing = "\n".join(json.dumps(tool_schema(t), ensure_ascii=False) for t in tools)
    return (
        "You can call functions to help answer the user. These functions are available, "
        "each described as JSON with its name, purpose and JSON Schema parameters:\n"
        f"<tools>\n{listing}\n</tools>\n"
        "To call a function, reply with a block like this for each call, and nothing else:\n"
        f'{CALL_OPEN}\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n{CALL_CLOSE}\n'
        "If no function is needed, answer normally."
    )


def render_call(name: str, arguments) -> str:
    """An earlier assistant call, written back the way the model is asked to write it; `arguments` is the
    parsed JSON (or the text, where it was not JSON)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str


def _parse_call(body: str, known: set[str]) -> ParsedCall | None:
    """The call `body` holds, or None; model output nested past json_limits is no call (and cannot crash us)."""
    try:
        value = json_limits.loads(body)
    except (json.JSONDecodeError, json_limits.UnsafeJSON):
        return None
    if not isinstance(value, dict) or value.get("name") not in known:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json_limits.loads(arguments)
        except (json.JSONDecodeError, json_limits.UnsafeJSON):
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(new_call_id(), value["name"], json.dumps(arguments, ensure_ascii=False))


# The grammar of a forced call writes {"name": "...", "arguments": {...}} in this layout.
_FORCED_NAME = re.compile(r'^\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*')


def _truncated_call(body: str, known: set[str]) -> ParsedCall | None:
    """A forced call cut short by max_tokens: its name and the arguments as far as they got, as
    OpenAI reports a call that ran out of tokens (finish_reason "length")."""
    match = _FORCED_NAME.match(body)
    if match is None or match.group(1) not in known:
        return None
    return ParsedCall(new_call_id(), match.group(1), body[match.end():])


class ToolCallParser:
    """Splits model output, fed in pieces, into plain content and completed tool calls.

    Text that might be the start of `<tool_call>` is held back until it is clear, so a streamed
    client never sees half a marker. A block that does not hold a valid call of a known function
    is passed through as content rather than dropped, except under a forced tool_choice, where
    the output is only ever a call: a truncated one is reported as such, never as markup.
    """

    def __init__(self, tools: list[Tool], forced: bool = False):
        self._known = {t.function.name for t in tools}
        self._forced = forced
        self._buffer = ""
        self._in_call = False
        self.calls: list[ParsedCall] = []

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        """New content to show and calls completed by this piece of text."""
        self._buffer += text
        content, calls = [], []
        while True:
            if self._in_call:
                end = self._buffer.find(CALL_CLOSE)
                if end < 0:
                    break
                body, self._buffer = self._buffer[:end], self._buffer[end + len(CALL_CLOSE):]
                self._in_call = False
                call = _parse_call(body.strip(), self._known)
                if call is None:
                    content.append(CALL_OPEN + body + CALL_CLOSE)
                else:
                    calls.append(call)
            else:
                start = self._buffer.find(CALL_OPEN)
                if start < 0:
                    keep = _partial_marker_len(self._buffer)
                    content.append(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                content.append(self._buffer[:start])
                self._buffer = self._buffer[start + len(CALL_OPEN):]
                self._in_call = True
        self.calls.extend(calls)
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """Flush at the end of output: an unclosed call still counts if its JSON is complete."""
        rest, self._buffer = self._buffer, ""
        if not self._in_call:
            # A forced call stopped inside its opening marker: nothing of it is content.
            return ("" if self._forced and CALL_OPEN.startswith(rest) else rest), []
        self._in_call = False
        call = _parse_call(rest.strip(), self._known)
        if call is None and self._forced:
            call = _truncated_call(rest.strip(), self._known)
            if call is None:
                return "", []
        if call is None:
            return CALL_OPEN + rest, []
        self.calls.append(call)
        return "", [call]


def _partial_marker_len(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of the call marker."""
    for size in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-size:]):
            return size
    return 0
