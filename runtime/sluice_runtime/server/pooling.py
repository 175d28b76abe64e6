"""/v1/embeddings and /v1/rerank: prompts the engine pools into normalized vectors, encoded or compared.

Neither endpoint generates: the engine runs the prompts through the model in packed forwards without the KV
cache (AsyncEngine.embed) and pools each one's final hidden states (--pooling). A decoder model has no
scoring head, so /v1/rerank scores a document by the cosine similarity of its embedding with the query's, as
vLLM does for embedding models.
"""
from __future__ import annotations

import base64
import struct

from sluice_runtime.engine.errors import EngineError

from .disconnect import ClientDisconnected, until_disconnected
from .generation import engine_error
from .protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    Usage,
)


class PoolingServing:
    def __init__(self, engine, lifecycle, metrics):
        self._engine = engine
        self._lifecycle = lifecycle
        self._metrics = metrics

    async def embeddings(self, body: EmbeddingRequest, prompts: list[list[int]], request_id: str, receive,
                         record) -> EmbeddingResponse:
        vectors = await self._vectors(prompts, body.dimensions, request_id, receive, record)
        data = [EmbeddingData(index=i, embedding=_encode(v, body.encoding_format)) for i, v in enumerate(vectors)]
        tokens = record.prompt_tokens
        return EmbeddingResponse(data=data, model=body.model, usage=Usage(prompt_tokens=tokens, total_tokens=tokens))

    async def rerank(self, body: RerankRequest, prompts: list[list[int]], request_id: str, receive,
                     record) -> RerankResponse:
        query, *documents = await self._vectors(prompts, None, request_id, receive, record)
        scores = [sum(q * d for q, d in zip(query, document)) for document in documents]
        order = sorted(range(len(documents)), key=lambda i: -scores[i])
        results = [RerankResult(index=i, relevance_score=scores[i],
                                document=RerankDocument(text=body.documents[i]) if body.return_documents else None)
                   for i in order[:body.top_n or None]]
        tokens = record.prompt_tokens
        return RerankResponse(id=f"rerank-{request_id}", model=body.model, results=results,
                              usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens))

    async def _vectors(self, prompts: list[list[int]], dimensions: int | None, request_id: str, receive,
                       record) -> list[list[float]]:
        with self._lifecycle.track(request_id):
            try:
                vectors = await until_disconnected(receive, self._engine.embed(prompts, dimensions))
            except ClientDisconnected:
                self._metrics.observe_cancelled()
                raise
            except (EngineError, ValueError) as exc:
                raise engine_error(exc) from None
        record.prompt_tokens = sum(len(p) for p in prompts)
        self._metrics.observe_pooled(record.prompt_tokens)
        return vectors


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector
