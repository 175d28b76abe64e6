"""`GET /load`: the small JSON document a runtime serves and the gateway polls to pick endpoints by load.

The runtime builds a `LoadReport`; the gateway parses the body with `LoadReport.model_validate_json`, which
raises a `ValueError` (pydantic's ValidationError) for anything that is not one, so a broken endpoint is taken
out of rotation instead of being scored on guessed numbers.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from .runtime_flags import MAX_LORAS


class _Document(BaseModel):
    # Strict: "3" or true is not a count. Unknown fields are ignored, so during a rolling upgrade a runtime that
    # reports more does not look broken to a gateway of the release before.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, frozen=True)


class PrefixCacheStats(_Document):
    queries: int = Field(ge=0, description="Prompt tokens looked up in the prefix cache since start.")
    hits: int = Field(ge=0, description="Of those, tokens found cached.")
    hit_rate: float = Field(ge=0, le=1, description="hits / queries; 0 before any query.")

    @classmethod
    def of(cls, queries: int, hits: int) -> "PrefixCacheStats":
        return cls(queries=queries, hits=hits, hit_rate=hits / queries if queries else 0.0)


class LoadReport(_Document):
    """What the gateway scores an endpoint by (the first three) and what an operator reads when debugging."""

    waiting: int = Field(ge=0, description="Requests queued in the engine, not yet scheduled.")
    running: int = Field(ge=0, description="Requests in the engine's running batch.")
    kv_cache_usage: float = Field(ge=0, le=1, description="Fraction of KV-cache blocks in use.")
    # None where an OpenAI-compatible server that is not Sluice's answers /load with the three above only.
    model: str | None = Field(default=None, description="The first served model name.")
    block_size: int | None = Field(default=None, ge=1, description="Tokens per KV-cache block.")
    num_kv_blocks: int | None = Field(default=None, ge=0, description="KV-cache size in blocks.")
    prefix_cache: PrefixCacheStats | None = None
    in_flight: int | None = Field(default=None, ge=0, description="HTTP generation requests being served.")
    draining: bool | None = Field(default=None, description="True once the runtime stopped taking new requests.")
    # The gateway sends a request with a budget (request_deadline) to a replica whose estimate fits it, when one does.
    estimated_queue_s: float | None = Field(
        default=None, ge=0, description="Seconds a request arriving now is expected to wait before it starts.",
    )
    # The gateway sends an adapter's requests to a replica that has it resident when one has room.
    loaded_adapters: tuple[Annotated[str, Field(min_length=1, max_length=253)], ...] | None = Field(
        default=None, max_length=MAX_LORAS.maximum, description="LoRA adapters resident in the engine now (the rest wait in CPU memory).",
    )
