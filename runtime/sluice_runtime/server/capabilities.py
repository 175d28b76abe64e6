"""What a served model can do: one record per model, reported in /v1/models and enforced on every request."""
from __future__ import annotations

from dataclasses import asdict, dataclass

EMBEDDING_METHOD = "mean-pooled final hidden states, L2-normalized"


@dataclass(frozen=True)
class ModelCapabilities:
    max_model_len: int
    chat: bool
    tools: bool
    json_schema: bool
    vision: bool = False
    # How /v1/embeddings vectors are made; None when the model serves no embeddings.
    embeddings: str | None = EMBEDDING_METHOD

    @classmethod
    def for_text_model(cls, max_model_len: int, has_chat_template: bool) -> "ModelCapabilities":
        # Tools and JSON schema rely on prompting plus constrained decoding, so any chat model has them.
        return cls(max_model_len=max_model_len, chat=has_chat_template, tools=has_chat_template,
                   json_schema=True)

    def as_dict(self) -> dict:
        return asdict(self)
