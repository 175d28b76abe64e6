"""Constrained decoding with llguidance: JSON object / JSON Schema outputs and forced tool calls.

llguidance was chosen over xgrammar and outlines-core because it is already a runtime dependency,
computes a token mask in tens of microseconds on the CPU without torch (so this layer stays free of
it), compiles JSON Schema and Lark grammars (a tool call is Lark text around an embedded JSON
Schema) without an up-front per-schema compile that would delay the first token, and is the
maintained engine behind structured output in llama.cpp, vLLM and SGLang.
"""
from __future__ import annotations

import json

import llguidance
import llguidance.hf
import numpy as np

from .errors import invalid_request
from .protocol import Tool
from .tool_calls import CALL_CLOSE, CALL_OPEN, tool_schema

# One fixed layout, the way JSON usually appears in training text: a small model given free
# whitespace tends to wander off into it instead of writing values.
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarConstraint:
    """A TokenConstraint (sluice_runtime/sampling_params.py) driven by one llguidance matcher."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int):
        self._matcher = matcher
        self._vocab_size = vocab_size

    def allowed_tokens(self) -> np.ndarray:
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, count=self._vocab_size, bitorder="little").view(bool)

    def accept_token(self, token_id: int) -> None:
        # A refused token puts the matcher in its error state, which reads as finished below.
        self._matcher.consume_token(token_id)

    def is_finished(self) -> bool:
        return self._matcher.is_stopped()

    def fork(self) -> "GrammarConstraint":
        return GrammarConstraint(self._matcher.deep_copy(), self._vocab_size)


class GrammarCompiler:
    """Turns response formats and tool choices into grammars for one tokenizer."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int]):
        # Building the token trie takes about half a second, so it is done once per server.
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos_token_ids)
        self._vocab_size = vocab_size

    def json_schema(self, schema: dict, param: str) -> str:
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_LAYOUT)
        except ValueError as exc:
            raise invalid_request(f"Invalid JSON schema: {exc}", param=param, code="invalid_schema") from None
        return self._checked(grammar, param)

    def json_object(self) -> str:
        return self.json_schema({"type": "object"}, "response_format")

    def tool_call(self, tools: list[Tool], name: str | None) -> str:
        """Exactly one `<tool_call>` block calling `name` (or any of `tools`) with schema-valid arguments."""
        chosen = [t for t in tools if name is None or t.function.name == name]
        options = [{"type": "object",
                    "properties": {"name": {"const": t.function.name},
                                   "arguments": tool_schema(t)["parameters"]},
                    "required": ["name", "arguments"], "additionalProperties": False} for t in chosen]
        call_schema = dict(options[0]) if len(options) == 1 else {"anyOf": options}
        call_schema["x-guidance"] = _JSON_LAYOUT
        lark = (f"start: {json.dumps(CALL_OPEN + chr(10))} call {json.dumps(chr(10) + CALL_CLOSE)}\n"
                f"call: %json {json.dumps(call_schema)}\n")
        return self._checked(llguidance.LLMatcher.grammar_from_lark(lark), "tools")

    def constraint(self, grammar: str) -> GrammarConstraint:
        return GrammarConstraint(llguidance.LLMatcher(self._tokenizer, grammar, log_level=0), self._vocab_size)

    def _checked(self, grammar: str, param: str) -> str:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self._tokenizer)
        if is_error:
            raise invalid_request(f"Unsupported or invalid JSON schema: {messages[0]}", param=param,
                                  code="invalid_schema")
        return grammar
