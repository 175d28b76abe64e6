"""Owns the model weights and the KV cache; runs one packed forward per engine step."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..models.config import ModelConfig
from ..models.llama import LlamaForCausalLM
from ..models.loading import ModelLoadError
from ..models.weights import load_weights
from .attention import AttentionMetadata, SequenceSpan, select_backend
from .sampler import SampleRequest, SampleResult, Sampler

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BatchItem:
    """One sequence's work in a step: compute `token_ids` starting at `start_pos`."""

    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sample: SampleRequest | None  # set when the last token's logits are sampled


class ModelRunner:
    def __init__(self, model_dir: Path, dtype: str, device: str, block_size: int,
                 kv_cache_memory: int, num_kv_blocks: int | None, max_model_len: int | None, seed: int):
        raw = json.loads((model_dir / "config.json").read_text())
        self.cfg = ModelConfig.from_hf(raw)
        self.max_model_len = max_model_len or self.cfg.max_position_embeddings
        if self.max_model_len > self.cfg.max_position_embeddings and not self.cfg.rope_scaling:
            raise ModelLoadError(
                f"--max-model-len {self.max_model_len} exceeds the model's context of "
                f"{self.cfg.max_position_embeddings} tokens")
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        self.block_size = block_size
        torch.manual_seed(seed)
        with torch.device("meta"):
            model = LlamaForCausalLM(self.cfg, self.max_model_len)
        model = model.to_empty(device=self.device).to(self.dtype)
        # Rotary tables are computed, not loaded; rebuild them on the real device in float32.
        model.rotary = type(model.rotary)(self.cfg.head_dim, self.max_model_len, self.cfg.rope_theta,
                                          self.cfg.rope_scaling).to(self.device)
        if self.cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        load_weights(model, model_dir, self.dtype)
        self.model = model.eval()
        self.backend = select_backend(device)
        self.num_blocks = num_kv_blocks or max(1, kv_cache_memory // self.bytes_per_block)
        slots = self.num_blocks * block_size
        shape = (slots, self.cfg.num_kv_heads, self.cfg.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                           torch.zeros(shape, dtype=self.dtype, device=self.device))
                          for _ in range(self.cfg.num_layers)]
        self.sampler = Sampler(seed)
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        log.info("model %s: %d layers, %.1fM parameters, %s; KV cache %d blocks x %d tokens (%.0f MiB)",
                 self.cfg.architecture, self.cfg.num_layers, self.num_parameters / 1e6, dtype,
                 self.num_blocks, block_size, self.num_blocks * self.bytes_per_block / 2**20)

    @property
    def bytes_per_block(self) -> int:
        element = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.cfg.num_layers * self.block_size * self.cfg.num_kv_heads * self.cfg.head_dim * element

    @torch.inference_mode()
    def execute(self, decodes: list[BatchItem], prefills: list[BatchItem]) -> list[SampleResult]:
        """Run one packed forward; returns one result per item with a sample request, in order."""
        input_ids: list[int] = []
        positions: list[int] = []
        spans: list[SequenceSpan] = []
        sample_rows: list[int] = []
        sample_requests: list[SampleRequest] = []
        for item in decodes + prefills:
            start = len(input_ids)
            input_ids.extend(item.token_ids)
            positions.extend(range(item.start_pos, item.start_pos + len(item.token_ids)))
            spans.append(SequenceSpan(start, len(item.token_ids), item.start_pos + len(item.token_ids),
                                      item.block_table))
            if item.sample is not None:
                sample_rows.append(len(input_ids) - 1)
                sample_requests.append(item.sample)
        meta = self.backend.build_metadata(spans[:len(decodes)], spans[len(decodes):], self.block_size,
                                           self.device, self.cfg.sliding_window)
        hidden = self.model.hidden_states(
            torch.tensor(input_ids, device=self.device), torch.tensor(positions, device=self.device),
            self.backend, meta, self.kv_caches)
        if not sample_rows:
            return []
        logits = self.model.logits(hidden[torch.tensor(sample_rows, device=self.device)]).cpu()
        return self.sampler(logits, sample_requests)

    @torch.inference_mode()
    def embed(self, token_ids: list[int]) -> list[float]:
        """Mean-pooled, L2-normalized final hidden states; runs without touching the KV cache."""
        n = len(token_ids)
        meta = AttentionMetadata(num_decodes=0, prefills=[SequenceSpan(0, n, n, [])],
                                 slot_mapping=torch.empty(0, dtype=torch.long), prefill_context=[None])
        hidden = self.model.hidden_states(torch.tensor(token_ids, device=self.device),
                                          torch.arange(n, device=self.device), self.backend, meta, None)
        pooled = hidden.float().mean(dim=0)
        return torch.nn.functional.normalize(pooled, dim=0).tolist()

    @staticmethod
    def make_generator(seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)
