"""Chat messages into the prompt text the chat template renders: each message checked for what the model and
the template can take (role order, tool calls and their answers, content parts), tools placed where the template
expects them."""
from __future__ import annotations

import json

from . import json_limits
from .capabilities import ModelCapabilities
from .chat_template import ChatTemplate
from .errors import invalid_request
from .protocol import ChatMessage, Tool
from .tool_calls import render_call, tools_system_prompt

_IMAGE_PARTS = {"image_url", "input_image", "image"}
_OTHER_MEDIA_PARTS = {"input_audio", "audio", "file", "video", "video_url"}


class ChatRenderer:
    def __init__(self, template: ChatTemplate, capabilities: ModelCapabilities):
        self._template = template
        self._caps = capabilities

    def render(self, messages: list[ChatMessage], tools: list[Tool] | None) -> str:
        """The prompt text of a conversation, each message checked (roles in order, calls answered, content
        the model can read); tools go to the template when it renders them, else into the system prompt."""
        if not messages:
            raise invalid_request("messages must contain at least one message.", param="messages")
        converted = self._template_messages(messages)
        template_tools = None
        if tools is not None:
            if self._template.renders_tools:
                template_tools = [t.model_dump(exclude_none=True) for t in tools]
            elif converted[0]["role"] == "system":
                converted[0] = {"role": "system",
                                "content": tools_system_prompt(tools) + "\n\n" + converted[0]["content"]}
            else:
                converted.insert(0, {"role": "system", "content": tools_system_prompt(tools)})
        return self._template.render(converted, template_tools)

    def _template_messages(self, messages: list[ChatMessage]) -> list[dict]:
        out: list[dict] = []
        open_calls: set[str] | None = None
        for i, message in enumerate(messages):
            text = self._text(message, i)
            where = f"messages[{i}]"
            if message.role == "tool":
                if open_calls is None:
                    raise invalid_request(f"{where}: a 'tool' message must follow an assistant message with "
                                          "tool_calls.", param=where, code="invalid_role_order")
                if not message.tool_call_id:
                    raise invalid_request(f"{where}: a 'tool' message needs tool_call_id.",
                                          param=f"{where}.tool_call_id")
                if open_calls and message.tool_call_id not in open_calls:
                    raise invalid_request(f"{where}: tool_call_id {message.tool_call_id!r} answers no call of "
                                          "the preceding assistant message.", param=f"{where}.tool_call_id",
                                          code="invalid_role_order")
                out.append({"role": "tool", "content": text or "", "tool_call_id": message.tool_call_id})
                continue
            open_calls = None
            if message.role == "assistant":
                if text is None and not message.tool_calls:
                    raise invalid_request(f"{where}: an assistant message needs content or tool_calls.",
                                          param=f"{where}.content")
                out.append(self._assistant_turn(text, message, where))
                if message.tool_calls:
                    open_calls = {c.id for c in message.tool_calls if c.id}
                continue
            if text is None:
                raise invalid_request(f"{where}: a '{message.role}' message needs content.",
                                      param=f"{where}.content")
            # Templates know system, user and assistant; 'developer' is OpenAI's newer name for system.
            out.append({"role": "system" if message.role == "developer" else message.role, "content": text})
        return out

    def _assistant_turn(self, text: str | None, message: ChatMessage, where: str) -> dict:
        calls = message.tool_calls or []
        arguments = [_arguments(c.function.arguments, f"{where}.tool_calls[{j}].function.arguments")
                     for j, c in enumerate(calls)]
        if self._template.renders_tools and calls:
            return {"role": "assistant", "content": text or "",
                    "tool_calls": [{"type": "function", "id": c.id,
                                    "function": {"name": c.function.name, "arguments": args}}
                                   for c, args in zip(calls, arguments)]}
        parts = ([text] if text else []) + [render_call(c.function.name, args) for c, args in zip(calls, arguments)]
        return {"role": "assistant", "content": "\n".join(parts)}

    def _text(self, message: ChatMessage, index: int) -> str | None:
        content = message.content
        if content is None or isinstance(content, str):
            return content
        pieces = []
        for j, part in enumerate(content):
            where = f"messages[{index}].content[{j}]"
            if part.type == "text":
                if part.text is None:
                    raise invalid_request(f"{where}: a text part needs 'text'.", param=where)
                pieces.append(part.text)
            elif part.type in _IMAGE_PARTS:
                if not self._caps.vision:
                    raise invalid_request(f"{where}: this model reads text only and cannot take images.",
                                          param=where, code="unsupported_content")
                raise invalid_request(f"{where}: image input is not implemented.", param=where,
                                      code="unsupported_content")
            elif part.type in _OTHER_MEDIA_PARTS:
                raise invalid_request(f"{where}: this model reads text only and cannot take {part.type} input.",
                                      param=where, code="unsupported_content")
            else:
                raise invalid_request(f"{where}: unknown content part type {part.type!r}.", param=where)
        return "\n".join(pieces)


def _arguments(text: str, param: str):
    """A call's arguments as sent back to the model: parsed when they are JSON, else the text as it is."""
    try:
        return json_limits.loads(text) if text else {}
    except json.JSONDecodeError:
        return text
    except json_limits.UnsafeJSON as exc:
        raise invalid_request(f"{param}: {exc}", param=param, code=exc.code) from None
