"""Request and response bodies of the OpenAI-compatible API (plus the vLLM-style extensions we accept).

Ranges that need no context are checked here; everything that depends on the model or the
prompt (context length, capabilities, role order) is checked when the request is normalized.
Unknown fields are ignored, as OpenAI-compatible servers commonly do, so newer clients keep working.
Types are strict, as in OpenAI's API: "yes" or 1 is not a boolean, "16" or 16.0 not an integer. A null in any
optional field is its default.
The fields that decide a request's cost (max_tokens, max_completion_tokens, n, ignore_eos) are not
here: sluice_contracts.request_cost reads them, as the gateway does (request_body.py).
"""
from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sluice_contracts.request_cost import MAX_CHOICES
from sluice_contracts.request_priority import MAX_PRIORITY, MIN_PRIORITY

MAX_SEED = 2**63 - 1

Probability = Annotated[float, Field(gt=0.0, le=1.0)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """An explicit null in an optional field means its default, as OpenAI's API and SDKs read it (clients
        serialise unset fields as null); a required field's null stays an error."""
        if not isinstance(data, dict) or None not in data.values():
            return data
        optional = {key for name, field in cls.model_fields.items() if not field.is_required()
                    for key in (name, field.alias) if key}
        return {key: value for key, value in data.items() if value is not None or key not in optional}


class ContentPart(_Body):
    """One part of a message's content; only `text` parts reach a text model."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: str = "{}"


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(_Body):
    name: str = Field(default="response", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingFields(_Body):
    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: Probability | None = None
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-MAX_SEED, le=MAX_SEED)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, Any] | None = None  # token ids and biases are checked against the model (normalize.py)
    user: str | None = None
    # Lower is served first (vLLM's convention); the gateway's x-sluice-priority header overrides it.
    priority: int = Field(0, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)


class EmbeddingRequest(_Body):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class RerankRequest(_Body):
    """The Jina/Cohere rerank body vLLM serves; `top_n` 0 or unset returns every document."""

    model: str
    query: str
    documents: list[str]
    top_n: int | None = Field(None, ge=0)
    return_documents: bool = True


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


# --- responses ---------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobEntry]


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None


class _GenerationResponse(BaseModel):
    """What a chat and a legacy completion response share; each adds its `object` and `choices`."""

    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    system_fingerprint: str | None = None
    usage: Usage


class ChatCompletionResponse(_GenerationResponse):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class CompletionLogprobs(BaseModel):
    """The legacy completions logprobs shape."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(_GenerationResponse):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sluice"
    root: str
    max_model_len: int
    capabilities: dict[str, Any]
    chat_template_version: str | None
    parent: str | None = None  # a LoRA adapter's base model, as vLLM lists it


class LoadLoraAdapterRequest(_Body):
    """vLLM's POST /v1/load_lora_adapter body."""

    lora_name: str
    lora_path: str


class UnloadLoraAdapterRequest(_Body):
    """vLLM's POST /v1/unload_lora_adapter body (its lora_int_id is accepted and not needed)."""

    lora_name: str
    lora_int_id: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(BaseModel):
    prompt: str
