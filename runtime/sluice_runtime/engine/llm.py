"""Offline batch inference, like vLLM's LLM class: many prompts in, all completions out."""
from __future__ import annotations

import itertools
from collections import deque

from tqdm import tqdm

from ..engine_config import EngineConfig
from ..sampling_params import SamplingParams
from .llm_engine import LLMEngine
from .outputs import RequestOutput


class LLM:
    def __init__(self, model: str = "smollm2", **engine_args):
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT adapter at `path` as `name` (needs enable_lora=True)."""
        self.engine.add_lora(name, path, self.engine.read_lora(path))

    def generate(self, prompts: list[str] | list[list[int]], params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True, lora: str | list[str | None] | None = None) -> list[RequestOutput]:
        """Prompts are strings or token id lists; returns one RequestOutput per prompt, in order. `lora` names
        the adapter of every prompt, or of each (None: the base model)."""
        params = params or SamplingParams()
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        loras = lora if isinstance(lora, list) else [lora] * len(prompts)
        order: dict[str, int] = {}
        # Fed as the queue has room: the online queue's bound (max_waiting) must not refuse an offline batch.
        pending = deque(enumerate(zip(prompts, per_prompt, loras)))
        results: list[RequestOutput | None] = [None] * len(prompts)
        with tqdm(total=len(prompts), desc="generating", unit="req", disable=not use_tqdm) as bar:
            while pending or self.engine.has_unfinished_requests():
                for _ in range(min(len(pending), self.engine.queue_room())):
                    i, (prompt, p, adapter) = pending.popleft()
                    ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
                    request_id = f"offline-{next(self._ids)}"
                    order[request_id] = i
                    # Nobody reads these tokens as they come: the step budget leaves the batch alone.
                    self.engine.add_request(request_id, ids, p, lora=adapter, streamed=False)
                for output in self.engine.step():
                    if output.finished:
                        results[order[output.request_id]] = output
                        bar.update(1)
        return results

    def embed(self, prompts: list[str] | list[list[int]], dimensions: int | None = None) -> list[list[float]]:
        """One L2-normalized vector per prompt (strings or token id lists), pooled as the engine's config says."""
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        return [v for batch in self.engine.embedding_batches(ids) for v in self.engine.embed(batch, dimensions)]
