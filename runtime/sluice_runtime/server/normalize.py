"""Validation and normalization: every generation request becomes one GenerationRequest for the engine.

Checks that need the model (context length, capabilities, vocabulary, template) live here, so a bad
request is refused with a 400 naming the offending parameter before it reaches the engine.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass

from sluice_contracts.request_cost import RequestCost
from sluice_runtime.sampling_params import MAX_LOGIT_BIAS, SamplingParams

from .capabilities import ModelCapabilities
from .chat_messages import ChatRenderer
from .chat_template import ChatTemplate
from .errors import APIError, invalid_request, model_not_found
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    NamedToolChoice,
    RerankRequest,
    ResponseFormat,
    TokenizeRequest,
    Tool,
)
from .structured_output import GrammarCompiler
from .tool_calls import CALL_CLOSE

MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256
MAX_TOOLS = 128
MAX_TOOLS_JSON_BYTES = 64 * 1024
MAX_PROMPTS = 64
MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's bound on the tokens one request may bias
# OpenAI's limits on one embeddings request: inputs in the list, and tokens summed over them.
MAX_EMBEDDING_INPUTS = 2048
MAX_EMBEDDING_TOKENS = 300_000


@dataclass
class ToolUse:
    tools: list[Tool]
    # "auto" lets the model choose; "required" and "named" force exactly one call by grammar.
    choice: str
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.choice != "auto"


@dataclass
class GenerationRequest:
    request_id: str
    endpoint: str
    model: str
    prompts: list[list[int]]
    prompt_texts: list[str | None]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    priority: int = 0
    tenant: str = ""
    share: float = 1.0
    # Top alternatives per token (0 = only the sampled token's); None when logprobs were not asked for.
    logprobs: int | None = None
    echo: bool = False
    tool_use: ToolUse | None = None
    response_format: str = "text"
    lora: str | None = None  # the LoRA adapter `model` names; None: the base model


class RequestNormalizer:
    def __init__(self, tokenizer, template: ChatTemplate, capabilities: ModelCapabilities,
                 grammars: GrammarCompiler, served_names: list[str], vocab_size: int,
                 lora_names: Callable[[], Collection[str]] = tuple):
        self._tokenizer = tokenizer
        self._messages = ChatRenderer(template, capabilities)
        self._caps = capabilities
        self._grammars = grammars
        self._served_names = served_names
        self._lora_names = lora_names  # the adapters loaded now: they come and go while serving
        self._vocab_size = vocab_size
        # No token covers more characters than the longest vocabulary entry, so text longer than
        # context x that many characters is too long without tokenizing it: a huge body then costs
        # the event loop nothing.
        longest = max((len(t) for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))) if t), default=1)
        self._max_prompt_chars = capabilities.max_model_len * max(longest, 1)

    # --- entry points -----------------------------------------------------------------------------

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self._served_names and name not in self._lora_names():
            raise model_not_found(name)

    def _lora(self, name: str | None) -> str | None:
        return None if name is None or name in self._served_names else name

    def chat(self, body: ChatCompletionRequest, cost: RequestCost, request_id: str) -> GenerationRequest:
        self.check_model(body.model)
        if not self._caps.chat:
            raise invalid_request(f"The model `{body.model}` has no chat template; use /v1/completions.",
                                  code="no_chat_template")
        tool_use = self._tool_use(body)
        text = self._messages.render(body.messages, tool_use.tools if tool_use else None)
        prompt = self._encode(text, False, "messages")
        self._check_context(len(prompt), cost, "messages")
        if body.top_logprobs is not None and not body.logprobs:
            raise invalid_request("top_logprobs requires logprobs to be true.", param="top_logprobs")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        grammar, response_format = self._grammar(body.response_format, tool_use)
        # parallel_tool_calls false: the model may choose to call, and generation ends with its first call.
        one_call = tool_use is not None and not tool_use.forced and body.parallel_tool_calls is False
        params = self._sampling(body, cost, logprobs, grammar, [CALL_CLOSE] if one_call else [])
        self._check_stream_options(body)
        return GenerationRequest(
            request_id=request_id, endpoint="chat", model=body.model, prompts=[prompt], prompt_texts=[text],
            params=params, stream=body.stream, include_usage=self._include_usage(body), priority=body.priority,
            logprobs=logprobs, tool_use=tool_use, response_format=response_format, lora=self._lora(body.model))

    def completion(self, body: CompletionRequest, cost: RequestCost, request_id: str) -> GenerationRequest:
        self.check_model(body.model)
        if body.suffix:
            raise invalid_request("suffix (fill-in-the-middle) is not supported by this model.", param="suffix")
        if body.best_of is not None and body.best_of != cost.choices:
            raise invalid_request("best_of different from n is not supported.", param="best_of")
        if body.echo and body.logprobs is not None:
            raise invalid_request("echo together with logprobs is not supported (no prompt logprobs).",
                                  param="echo")
        prompts, texts = self._completion_prompts(body.prompt)
        for prompt in prompts:
            self._check_context(len(prompt), cost, "prompt")
        grammar, response_format = self._grammar(body.response_format, None)
        params = self._sampling(body, cost, body.logprobs, grammar)
        self._check_stream_options(body)
        return GenerationRequest(
            request_id=request_id, endpoint="completion", model=body.model, prompts=prompts, prompt_texts=texts,
            params=params, stream=body.stream, include_usage=self._include_usage(body), priority=body.priority,
            logprobs=body.logprobs, echo=body.echo, response_format=response_format, lora=self._lora(body.model))

    def embedding_inputs(self, body: EmbeddingRequest) -> list[list[int]]:
        self.check_model(body.model)
        self._check_pooling(body.model)
        size = self._caps.embedding_dimensions
        if body.dimensions is not None and size is not None and body.dimensions > size:
            raise invalid_request(f"dimensions must be at most {size}, the model's embedding size; got "
                                  f"{body.dimensions}.", param="dimensions")
        prompts, _ = self._completion_prompts(body.input, param="input", limit=MAX_EMBEDDING_INPUTS)
        return self._check_pooled(prompts, "input")

    def rerank_inputs(self, body: RerankRequest) -> list[list[int]]:
        """The query's tokens, then each document's."""
        self.check_model(body.model)
        self._check_pooling(body.model)
        if not body.documents:
            raise invalid_request("documents must not be empty.", param="documents")
        if len(body.documents) > MAX_EMBEDDING_INPUTS:
            raise invalid_request(f"At most {MAX_EMBEDDING_INPUTS} documents per request, got "
                                  f"{len(body.documents)}.", param="documents")
        prompts = self._check_pooled([self._encode(body.query, True, "query")], "query")
        documents = [self._encode(text, True, "documents") for text in body.documents]
        return prompts + self._check_pooled(documents, "documents")

    def _check_pooling(self, model: str) -> None:
        if self._lora(model) is not None:
            raise invalid_request(f"`{model}` is a LoRA adapter; embeddings come from the base model.",
                                  param="model")
        if self._caps.embeddings is None:
            raise invalid_request(f"The model `{model}` does not serve embeddings.", param="model")

    def _check_pooled(self, prompts: list[list[int]], param: str) -> list[list[int]]:
        """Prompts that are pooled, not continued: each may fill the whole context, none may be empty."""
        for prompt in prompts:
            if not prompt:
                raise invalid_request(f"{param} must not be empty.", param=param)
            if len(prompt) > self._caps.max_model_len:
                raise invalid_request(
                    f"This model's maximum context length is {self._caps.max_model_len} tokens, but the {param} "
                    f"has {len(prompt)} tokens. Shorten the {param}.", param=param, code="context_length_exceeded")
        total = sum(len(p) for p in prompts)
        if total > MAX_EMBEDDING_TOKENS:
            raise invalid_request(f"At most {MAX_EMBEDDING_TOKENS} tokens summed over the {param} of one request, "
                                  f"got {total}.", param=param)
        return prompts

    def tokenize(self, body: TokenizeRequest) -> list[int]:
        self.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise invalid_request("Send exactly one of prompt or messages.", param="prompt")
        if body.messages is not None:
            text = self._messages.render(body.messages, None)
            return self._tokenizer.encode(text, add_special_tokens=False)
        return self._tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)

    def check_token_ids(self, ids: list[int], param: str) -> None:
        bad = next((t for t in ids if not 0 <= t < self._vocab_size), None)
        if bad is not None:
            raise invalid_request(f"Token id {bad} is outside the vocabulary [0, {self._vocab_size}).", param=param,
                                  code="invalid_token_id")

    # --- messages and tools -----------------------------------------------------------------------

    def _tool_use(self, body: ChatCompletionRequest) -> ToolUse | None:
        tools, choice = body.tools or [], body.tool_choice
        if not tools:
            if choice not in (None, "none", "auto"):
                raise invalid_request("tool_choice requires tools.", param="tool_choice")
            return None
        if not self._caps.tools:
            raise invalid_request(f"The model `{body.model}` does not support tools.", param="tools")
        if len(tools) > MAX_TOOLS:
            raise invalid_request(f"At most {MAX_TOOLS} tools are allowed, got {len(tools)}.", param="tools")
        size = len(json.dumps([t.model_dump(exclude_none=True) for t in tools]))
        if size > MAX_TOOLS_JSON_BYTES:
            raise invalid_request(f"The tools take {size} bytes as JSON; at most {MAX_TOOLS_JSON_BYTES} are allowed.",
                                  param="tools", code="tools_too_large")
        names = [t.function.name for t in tools]
        if len(set(names)) != len(names):
            raise invalid_request("Tool function names must be unique.", param="tools")
        for i, tool in enumerate(tools):
            if tool.function.parameters is not None:
                self._grammars.json_schema(tool.function.parameters, f"tools[{i}].function.parameters")
        if choice == "none":
            return None
        if isinstance(choice, NamedToolChoice):
            if choice.function.name not in names:
                raise invalid_request(f"tool_choice names {choice.function.name!r}, which is not among the tools.",
                                      param="tool_choice")
            return ToolUse(tools, "named", choice.function.name)
        return ToolUse(tools, choice or "auto")

    def _grammar(self, fmt: ResponseFormat | None, tool_use: ToolUse | None) -> tuple[str | None, str]:
        kind = fmt.type if fmt is not None else "text"
        if kind != "text" and tool_use is not None:
            raise invalid_request("response_format json_object/json_schema cannot be combined with tools; "
                                  "set tool_choice to 'none' or drop response_format.", param="response_format")
        if tool_use is not None and tool_use.forced:
            return self._grammars.tool_call(tool_use.tools, tool_use.name), "tool_call"
        if kind == "text":
            return None, kind
        if not self._caps.json_schema:
            raise invalid_request("This model does not support structured output.", param="response_format")
        if kind == "json_object":
            return self._grammars.json_object(), kind
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise invalid_request("response_format json_schema needs json_schema.schema.",
                                  param="response_format.json_schema")
        return self._grammars.json_schema(fmt.json_schema.schema_, "response_format.json_schema.schema"), kind

    # --- prompts, context and sampling ------------------------------------------------------------

    def _completion_prompts(self, prompt, param: str = "prompt",
                            limit: int = MAX_PROMPTS) -> tuple[list[list[int]], list[str | None]]:
        if isinstance(prompt, str):
            items: list = [prompt]
        elif prompt and isinstance(prompt[0], int):
            items = [prompt]
        else:
            items = list(prompt)
        if not items:
            raise invalid_request(f"{param} must not be empty.", param=param)
        if len(items) > limit:
            raise invalid_request(f"At most {limit} {param}s per request, got {len(items)}.", param=param)
        prompts, texts = [], []
        for item in items:
            if isinstance(item, str):
                ids = self._encode(item, True, param)
                texts.append(item)
            else:
                self.check_token_ids(item, param)
                ids = list(item)
                texts.append(None)
            if not ids:
                raise invalid_request(f"{param} must not be empty.", param=param)
            prompts.append(ids)
        return prompts, texts

    def _encode(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        if len(text) > self._max_prompt_chars:
            raise invalid_request(
                f"This model's maximum context length is {self._caps.max_model_len} tokens, but the {param} has "
                f"{len(text)} characters, which is more than that many tokens can hold. Shorten the {param}.",
                param=param, code="context_length_exceeded")
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def _too_long(self, prompt_len: int, param: str) -> APIError:
        return invalid_request(
            f"This model's maximum context length is {self._caps.max_model_len} tokens, but the {param} has "
            f"{prompt_len} tokens, leaving no room for output. Shorten the {param}.",
            param=param, code="context_length_exceeded")

    def _check_context(self, prompt_len: int, cost: RequestCost, prompt_param: str) -> None:
        limit = self._caps.max_model_len
        if prompt_len >= limit:
            raise self._too_long(prompt_len, prompt_param)
        max_tokens, max_param = cost.max_tokens, cost.max_tokens_param
        if max_tokens is not None and prompt_len + max_tokens > limit:
            raise invalid_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the {prompt_param}, {max_tokens} for the "
                f"completion). Reduce the {prompt_param} or {max_param}.",
                param=max_param, code="context_length_exceeded")

    def _sampling(self, body, cost: RequestCost, logprobs: int | None, grammar: str | None,
                  own_stop: list[str] = ()) -> SamplingParams:
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stop) > MAX_STOP_SEQUENCES:
            raise invalid_request(f"At most {MAX_STOP_SEQUENCES} stop sequences are allowed, got {len(stop)}.",
                                  param="stop")
        for s in stop:
            if not s or len(s) > MAX_STOP_CHARS:
                raise invalid_request(f"Each stop sequence must have 1 to {MAX_STOP_CHARS} characters.", param="stop")
        self.check_token_ids(body.stop_token_ids or [], "stop_token_ids")
        logit_bias = self._logit_bias(body.logit_bias or {})
        try:
            return SamplingParams(
                n=cost.choices, max_tokens=cost.max_tokens, min_tokens=body.min_tokens,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
                min_p=body.min_p or 0.0, presence_penalty=body.presence_penalty,
                frequency_penalty=body.frequency_penalty, repetition_penalty=body.repetition_penalty,
                seed=body.seed, stop=stop + list(own_stop), stop_token_ids=list(body.stop_token_ids or []),
                ignore_eos=cost.ignore_eos, logprobs=logprobs,
                include_stop_str_in_output=body.include_stop_str_in_output,
                skip_special_tokens=body.skip_special_tokens, logit_bias=logit_bias,
                constraint=self._grammars.constraint(grammar) if grammar else None)
        except ValueError as exc:
            raise invalid_request(str(exc)) from None

    def _logit_bias(self, given: dict) -> dict[int, float]:
        if len(given) > MAX_LOGIT_BIAS_ENTRIES:
            raise invalid_request(f"logit_bias may bias at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(given)}.",
                                  param="logit_bias")
        bias = {}
        for key, value in given.items():
            if not (key.isascii() and key.isdigit()):
                raise invalid_request(f"logit_bias keys must be token ids written as decimal integers, got {key!r}.",
                                      param="logit_bias")
            token = int(key)
            if token >= self._vocab_size:
                raise invalid_request(f"logit_bias names token id {token}, which is outside the vocabulary "
                                      f"[0, {self._vocab_size}).", param="logit_bias", code="invalid_token_id")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not \
                    -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise invalid_request(f"logit_bias values must be numbers from {-MAX_LOGIT_BIAS:g} to "
                                      f"{MAX_LOGIT_BIAS:g}; token {key} has {value!r}.", param="logit_bias")
            if token in bias:
                raise invalid_request(f"logit_bias names token id {token} twice.", param="logit_bias")
            bias[token] = float(value)
        return bias

    @staticmethod
    def _check_stream_options(body) -> None:
        if body.stream_options is not None and not body.stream:
            raise invalid_request("stream_options is only allowed when stream is true.", param="stream_options")

    @staticmethod
    def _include_usage(body) -> bool:
        return bool(body.stream and body.stream_options and body.stream_options.include_usage)
