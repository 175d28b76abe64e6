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
A stream announces a call once its name is read and sends its arguments as they are generated
(ToolCallParser), so the non-streamed answer is made by the same parser from the whole text.
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


@dataclass
class CallDelta:
    """What one piece of output added to a call: `new` on the piece that named it, then argument text."""

    index: int
    call: ParsedCall
    new: bool
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


_PENDING = "pending"
_OTHER = "other"
_NAME = None  # where the function's name stands in the head
_HEAD = ("{", '"name"', ":", _NAME, ",", ('"arguments"', '"parameters"'), ":")


def _head(text: str, known: set[str]) -> str | tuple[str, int]:
    """Reads `{"name": "<known>", "arguments": ` (or "parameters") and the first character of the value.

    Returns the name and where the value starts once all of it is there; _PENDING while `text` may still
    become that; _OTHER when it cannot (another layout, an unknown name), so the block is read whole."""
    pos, name = 0, None
    for step in _HEAD:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        rest = text[pos:]
        if not rest:
            return _PENDING
        if step is _NAME:
            end = rest.find('"', 1)
            if rest[0] != '"' or "\\" in rest[:end if end > 0 else len(rest)]:
                return _OTHER
            if end < 0:
                return _PENDING if any(n.startswith(rest[1:]) for n in known) else _OTHER
            name = rest[1:end]
            if name not in known:
                return _OTHER
            pos += end + 1
            continue
        for literal in (step,) if isinstance(step, str) else step:
            if rest.startswith(literal):
                pos += len(literal)
                break
        else:
            options = (step,) if isinstance(step, str) else step
            return _PENDING if any(o.startswith(rest) for o in options) else _OTHER
    while pos < len(text) and text[pos].isspace():
        pos += 1
    if pos == len(text):
        return _PENDING
    return (name, pos) if text[pos] in '{"' else _OTHER


class _ArgumentsReader:
    """The arguments of a call as they are written: a JSON object passed through as its text, or a JSON string
    (holding the object's text) decoded as it comes. `feed` returns the argument text the piece completed."""

    def __init__(self, opening: str):
        self.encoded = opening == '"'
        self.done = False
        self.closed_early = False  # the call's close marker came before its arguments ended
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._pending = ""  # an escape sequence (or a possible close marker) not yet complete

    def feed(self, text: str) -> tuple[str, str]:
        """The argument text `text` adds, and what is left of it after the arguments ended."""
        return self._string(text) if self.encoded else self._object(text)

    def _object(self, text: str) -> tuple[str, str]:
        text, self._pending = self._pending + text, ""
        out = []
        for i, ch in enumerate(text):
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == "<":
                # Not JSON: maybe the model closed the call before its arguments were complete.
                rest = text[i:]
                if rest.startswith(CALL_CLOSE):
                    self.done = self.closed_early = True
                    return "".join(out), rest
                if CALL_CLOSE.startswith(rest):
                    self._pending = rest
                    return "".join(out), ""
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
            out.append(ch)
            if self._depth == 0:
                self.done = True
                return "".join(out), text[i + 1:]
        return "".join(out), ""

    def _string(self, text: str) -> tuple[str, str]:
        text, self._pending = self._pending + text, ""
        if not self._in_string:  # the opening quote
            self._in_string, text = True, text[1:]
        i, end = 0, None
        while i < len(text):
            if text[i] == "\\":
                size = 6 if text[i + 1:i + 2] == "u" else 2
                # A high surrogate is only decodable together with the low one after it.
                if size == 6 and text[i + 2:i + 4].lower() in ("d8", "d9", "da", "db") and (
                        len(text) < i + 8 or text[i + 6:i + 8] == "\\u"):
                    size = 12
                if i + size > len(text):
                    break
                i += size
            elif text[i] == '"':
                end = i
                break
            else:
                i += 1
        body = text[:i if end is None else end]
        if end is None:
            self._pending = text[i:]
        try:
            decoded = json.loads(f'"{body}"')
        except json.JSONDecodeError:
            decoded = body
        if end is None:
            return decoded, ""
        self.done = True
        return decoded, text[end + 1:]


class ToolCallParser:
    """Splits model output, fed in pieces, into plain content and tool calls, the calls as they form.

    Text that might be the start of `<tool_call>` is held back until it is clear, so a streamed client never
    sees half a marker. A call written as `{"name": ..., "arguments": ...}` (the layout asked for, and the only
    one a forced tool_choice allows) is announced once its name is read and its arguments follow as they are
    generated, so a streamed client sees the call form. Any other block is read whole: it is a call when it
    holds one of a known function, else it is passed through as content, except under a forced tool_choice,
    where the output is only ever a call: a truncated one is reported as such, never as markup.
    """

    def __init__(self, tools: list[Tool], forced: bool = False):
        self._known = {t.function.name for t in tools}
        self._forced = forced
        self._buffer = ""
        self._in_call = False
        self._arguments: _ArgumentsReader | None = None  # the streamed call's arguments, while they are read
        self._whole = False  # this block is read whole: it does not start like a streamed call
        self.calls: list[ParsedCall] = []

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        """New content to show and what this piece of text added to calls."""
        self._buffer += text
        content: list[str] = []
        deltas: list[CallDelta] = []
        while True:
            if self._in_call:
                if not self._step_call(content, deltas):
                    break
            else:
                start = self._buffer.find(CALL_OPEN)
                if start < 0:
                    keep = _partial_marker_len(self._buffer)
                    content.append(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                content.append(self._buffer[:start])
                self._buffer = self._buffer[start + len(CALL_OPEN):]
                self._in_call, self._whole, self._arguments = True, False, None
        return "".join(content), _merged(deltas)

    def _step_call(self, content: list[str], deltas: list[CallDelta]) -> bool:
        """Reads as much of the current block as the buffer allows; False when it needs more text."""
        reader = self._arguments
        if reader is not None and not reader.done:
            piece, self._buffer = reader.feed(self._buffer)
            if piece:
                self.calls[-1].arguments += piece
                deltas.append(CallDelta(len(self.calls) - 1, self.calls[-1], False, piece))
            if not reader.done:
                return False
            if reader.closed_early:
                self._buffer = self._buffer[len(CALL_CLOSE):]
                self._in_call = False
            return True
        if reader is None and not self._whole:
            head = _head(self._buffer, self._known)
            if head == _PENDING:
                return False
            if head == _OTHER:
                self._whole = True
            else:
                name, start = head
                self.calls.append(ParsedCall(new_call_id(), name, ""))
                deltas.append(CallDelta(len(self.calls) - 1, self.calls[-1], True, ""))
                self._arguments = _ArgumentsReader(self._buffer[start])
                self._buffer = self._buffer[start:]
                return True
        end = self._buffer.find(CALL_CLOSE)
        if end < 0:
            if reader is not None:  # what follows the arguments (the closing brace) is no content
                keep = _partial_marker_len(self._buffer, CALL_CLOSE)
                self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        body, self._buffer = self._buffer[:end], self._buffer[end + len(CALL_CLOSE):]
        self._in_call = False
        if reader is None:
            call = _parse_call(body.strip(), self._known)
            if call is None:
                content.append(CALL_OPEN + body + CALL_CLOSE)
            else:
                self.calls.append(call)
                deltas.append(CallDelta(len(self.calls) - 1, call, True, call.arguments))
        return True

    def finish(self) -> tuple[str, list[CallDelta]]:
        """Flush at the end of output: an unclosed call still counts if its JSON is complete, and a streamed
        call cut short keeps the arguments it got."""
        rest, self._buffer = self._buffer, ""
        if not self._in_call:
            # A forced call stopped inside its opening marker: nothing of it is content.
            return ("" if self._forced and CALL_OPEN.startswith(rest) else rest), []
        self._in_call = False
        if self._arguments is not None:
            return "", []
        call = _parse_call(rest.strip(), self._known)
        if call is None and self._forced:
            call = _truncated_call(rest.strip(), self._known)
            if call is None:
                return "", []
        if call is None:
            return CALL_OPEN + rest, []
        self.calls.append(call)
        return "", [CallDelta(len(self.calls) - 1, call, True, call.arguments)]


def _merged(deltas: list[CallDelta]) -> list[CallDelta]:
    """One delta per call for one piece of text."""
    out: list[CallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index:
            out[-1] = CallDelta(d.index, d.call, out[-1].new or d.new, out[-1].arguments + d.arguments)
        else:
            out.append(d)
    return out


def _partial_marker_len(text: str, marker: str = CALL_OPEN) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
