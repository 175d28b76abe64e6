"""The chat template: the model's own (or --chat-template FILE), its version hash, and rendering."""
from __future__ import annotations

import hashlib
from pathlib import Path

import jinja2
import jinja2.meta

from .errors import invalid_request


class ChatTemplate:
    def __init__(self, tokenizer, source: str | None):
        self._tokenizer = tokenizer
        self.source = source
        # The hash of the template text is its version: logged per request and reported in /v1/models,
        # so a change in prompt formatting is visible when outputs change.
        self.version = hashlib.sha256(source.encode()).hexdigest()[:12] if source else None
        self.renders_tools = bool(source) and "tools" in _variables(source)

    @classmethod
    def load(cls, tokenizer, path: str | None) -> "ChatTemplate":
        """The template in `path` if given, else the tokenizer's; ValueError with a clear message if unusable."""
        if path is None:
            return cls(tokenizer, getattr(tokenizer, "chat_template", None) or None)
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"chat template file {path} does not exist")
        source = file.read_text()
        try:
            _variables(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template {path} is not valid Jinja (line {exc.lineno}): {exc.message}") from None
        return cls(tokenizer, source)

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The prompt text for `messages`, ending with the assistant's turn; a template error is the client's 400."""
        if self.source is None:
            raise invalid_request("This model has no chat template; use /v1/completions or start the server "
                                  "with --chat-template FILE.", param="messages", code="no_chat_template")
        try:
            return self._tokenizer.apply_chat_template(
                messages, tools=tools, chat_template=self.source, add_generation_prompt=True, tokenize=False)
        except jinja2.TemplateError as exc:
            raise invalid_request(f"The chat template rejected these messages: {exc}", param="messages",
                                  code="invalid_messages") from None


def _variables(source: str) -> set[str]:
    env = jinja2.Environment()
    return jinja2.meta.find_undeclared_variables(env.parse(source))
