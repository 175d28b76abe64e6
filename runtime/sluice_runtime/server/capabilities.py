"""What a served model can do: one record per model, reported in /v1/models and enforced on every request."""
from __future__ import annotations

from dataclasses import asdict, dataclass

# How /v1/embeddings makes a vector, per --pooling.
EMBEDDING_METHODS = {
    "mean": "mean-pooled final hidden states, L2-normalized",
    "last": "the last token's final hidden state, L2-normalized",
}
RERANK_METHOD = "cosine similarity of the query's and each document's embedding"


@dataclass(frozen=True)
class ModelCapabilities:
    max_model_len: int
    chat: bool
    tools: bool
    json_schema: bool
    vision: bool = False
    # How /v1/embeddings vectors are made and how long they are at most (`dimensions` may cut them shorter).
    embeddings: str | None = EMBEDDING_METHODS["mean"]
    embedding_dimensions: int | None = None
    # How /v1/rerank scores a document.
    rerank: str | None = RERANK_METHOD

    @classmethod
    def for_text_model(cls, max_model_len: int, has_chat_template: bool, pooling: str,
                       hidden_size: int) -> "ModelCapabilities":
        # Tools and JSON schema rely on prompting plus constrained decoding, so any chat model has them.
        return cls(max_model_len=max_model_len, chat=has_chat_template, tools=has_chat_template,
                   json_schema=True, embeddings=EMBEDDING_METHODS[pooling], embedding_dimensions=hidden_size)

    def as_dict(self) -> dict:
        return asdict(self)
