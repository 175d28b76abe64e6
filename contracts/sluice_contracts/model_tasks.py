"""The tasks a served model may take on, one per OpenAI-style endpoint.

The InferenceModel's `capabilities.tasks` lists them, the routing table carries the list per backend, and the
gateway refuses (400) a request whose route has no backend serving its task. A model whose spec does not say
serves every task, which is what Sluice's runtime serves for any model it loads.
"""
from __future__ import annotations

from typing import Literal

Task = Literal["chat", "completion", "embedding", "rerank"]

TASKS: tuple[Task, ...] = ("chat", "completion", "embedding", "rerank")
DEFAULT_TASKS: tuple[Task, ...] = TASKS
# Tasks whose prompts are pooled, not continued: they generate no token, so a prompt may fill the whole context.
POOLING_TASKS: tuple[Task, ...] = ("embedding", "rerank")

# The endpoint of each task, for error messages.
TASK_PATHS: dict[Task, str] = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embedding": "/v1/embeddings",
    "rerank": "/v1/rerank",
}

