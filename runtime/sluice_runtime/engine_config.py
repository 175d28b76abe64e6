"""Engine settings: one dataclass whose fields are also the CLI flags (sluice_runtime.flags), and their validation."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from sluice_contracts import runtime_flags
from sluice_contracts.request_deadline import MAX_BUDGET_S
from sluice_contracts.runtime_flags import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DTYPE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_LORA_RANK,
    DEFAULT_MAX_NUM_SEQS,
    DTYPES,
    LORA_NAME_PATTERN,
    MAX_LORA_RANK,
    MAX_LORAS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    QUANTIZATIONS,
    TENSOR_PARALLEL_SIZE,
)

from .engine.speculation import SpeculativeConfig, parse_speculative_config
from .flags import add_flags, flag, from_flags

AUTO, OFF = "auto", "off"  # --target-itl-ms modes besides milliseconds

# The names executor.attention.BACKENDS accepts, repeated so parsing flags does not import torch.
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash-attn")
# How /v1/embeddings turns a prompt's final hidden states into one vector (then L2-normalized).
POOLINGS = ("mean", "last")
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_memory(value: str | int) -> int:
    """'1GiB', '512Mi', '2G', '1048576' -> bytes."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", value.lower())
    if not match:
        raise ValueError(f"cannot parse memory size {value!r}; use e.g. 512MiB, 1GiB or a byte count")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit or ""])


def parse_target_itl(value: str | float) -> str | float:
    """'auto', 'off' or a positive number of milliseconds (a number or its text)."""
    if isinstance(value, str) and value.strip().lower() in (AUTO, OFF):
        return value.strip().lower()
    number = float("nan")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if not (0 < number < 3_600_000):  # also refuses nan and inf
        raise ValueError(f"target itl ms must be auto, off or a number of milliseconds above 0 (at most an hour), "
                         f"got {value!r}")
    return number


@dataclass
class EngineConfig:
    model: str = flag("smollm2", "'smollm2' (embedded default), a local HF model directory, or hf:ORG/NAME")
    dtype: str = flag(DEFAULT_DTYPE, "weights, activations and KV cache; auto: bfloat16 where the hardware computes it "
                                 "natively (CUDA, CPUs with AVX512-BF16 or AMX), else float32 (float16 on old GPUs)",
                      choices=DTYPES)
    quantization: str | None = flag(
        None, "int8: linear weights and embedding tables in int8 with a scale per output channel; on x86 CPUs "
              "with AVX-512 VNNI activations are quantized per call too (int8 x int8 matmuls), elsewhere the "
              "weights are widened per call (default: the --dtype weights)", choices=QUANTIZATIONS)
    device: str = flag("cpu", "cpu or cuda[:N]")
    # Rounded up to what the attention backend reads (a multiple of 256 tokens for flash-attn).
    block_size: int = flag(DEFAULT_BLOCK_SIZE, "tokens per KV-cache block, a power of two up to 256 (rounded up to a multiple of "
                               "256 for flash-attn)")
    # The replica's budget, all tensor-parallel ranks together; a value given on CUDA caps what
    # gpu_memory_utilization leaves.
    kv_cache_memory: int | str | None = flag(
        None, "KV-cache budget of the replica, e.g. 512MiB or 2GiB (default: 1GiB on the CPU; on CUDA what "
              "--gpu-memory-utilization leaves, which a value given here caps)")
    num_kv_blocks: int | None = flag(None, "KV-cache size in blocks; overrides --kv-cache-memory", parse=int)
    max_model_len: int | None = flag(None, "context length (default: the model's)", parse=int)
    max_num_seqs: int = flag(DEFAULT_MAX_NUM_SEQS, "most sequences in one batch")
    # A decode step carries one token of every running sequence, so the default grows with max_num_seqs.
    max_num_batched_tokens: int | None = flag(None, "token budget of one engine step (default: 1024, or "
                                                    "--max-num-seqs where that is more)", parse=int)
    target_itl_ms: str | float = flag(
        "auto", "while requests decode, a step carrying prompt chunks takes at most this long: auto (a multiple "
                "of the decode-only step at the recent largest batch, measured as the engine runs; README), off "
                "(token budget only), or milliseconds")
    max_waiting: int = flag(1024, "queued requests before new ones are refused as overloaded")
    default_budget_s: float = flag(
        30.0, "seconds a request may wait for its answer's first byte (the first token of a stream) when neither "
              "its client's timeout header nor the gateway's budget header nor its priority class gives one "
              "(sluice_contracts.request_deadline); a request not expected to be answered within its budget is "
              "refused at once with 503 and Retry-After, and one whose budget passes while queued gets that 503")
    deadline_admission: bool = flag(True, "admit requests by queue length alone (--max-waiting): no refusal for "
                                          "a budget", option="--no-deadline-admission")
    enable_prefix_caching: bool = flag(True, "disable reuse of cached prompt blocks", option="--no-prefix-caching")
    # A request preempted this often is no longer chosen as a victim, so it cannot livelock.
    max_preemptions_per_request: int = 4
    seed: int = flag(0, "seed of requests that sample without a seed of their own")
    attention_backend: str = flag("auto", "attention kernels; auto: flash-attn if importable on CUDA, else triton "
                                          "on CUDA, else torch", choices=ATTENTION_BACKENDS)
    enforce_eager: bool = flag(False, "CUDA: run decode steps without CUDA graphs")
    gpu_memory_utilization: float = flag(DEFAULT_GPU_MEMORY_UTILIZATION, "CUDA: share of each GPU for weights, activations and the KV cache, "
                                              "sized at start")
    tensor_parallel_size: int = flag(1, "shard the model across this many GPUs (processes on the CPU)")
    pooling: str = flag("mean", "how /v1/embeddings and /v1/rerank pool a prompt's final hidden states: mean (of "
                                "every token) or last (the last token's, what decoder embedding models are trained "
                                "for); L2-normalized either way", choices=POOLINGS)
    enable_lora: bool = flag(False, "serve LoRA adapters: given with --lora or loaded with POST /v1/load_lora_adapter")
    max_loras: int = flag(1, "LoRA adapters resident at once; requests for others wait while their weights stay "
                             "in CPU memory")
    max_lora_rank: int = flag(DEFAULT_MAX_LORA_RANK, "largest LoRA rank accepted; every resident slot is sized for it")
    lora: list[str] = flag(default_factory=list, help="a LoRA adapter served from the start, as NAME=PATH (a PEFT "
                                                      "directory); repeat for more", metavar="NAME=PATH",
                           repeatable=True)
    speculative_config: str | dict | SpeculativeConfig | None = flag(
        None, "speculative decoding, as a JSON object: {\"method\": \"ngram\", \"num_speculative_tokens\": K "
              f"({runtime_flags.NUM_SPECULATIVE_TOKENS.minimum} to {runtime_flags.NUM_SPECULATIVE_TOKENS.maximum}), "
              "\"prompt_lookup_max\": N, \"prompt_lookup_min\": M} drafts up to K tokens from the "
              "request's own prompt and output after its last N..M tokens and checks them in one step (either "
              "bound alone sets both; neither: 3 and 1); each step drafts only what is likely to pay for the time "
              "it adds, so a lone stream drafts K and a large batch little. Lossless: greedy and seeded output as without it, sampled "
              "output from the same distribution. Not for requests with a grammar (json_schema, tools), which "
              "decode one token a step. CPU only, and not with --enable-lora or "
              "--tensor-parallel-size above 1 (default: off)", metavar="JSON")

    def __post_init__(self) -> None:
        if self.speculative_config is not None and not isinstance(self.speculative_config, SpeculativeConfig):
            self.speculative_config = parse_speculative_config(self.speculative_config)
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_memory(self.kv_cache_memory)
        self.target_itl_ms = parse_target_itl(self.target_itl_ms)
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(1024, self.max_num_seqs) if self.max_num_seqs in MAX_NUM_SEQS else 1024
        checks = [
            (self.dtype in DTYPES, runtime_flags.dtype_message(self.dtype)),
            (runtime_flags.is_block_size(self.block_size), runtime_flags.block_size_message(self.block_size)),
            (self.kv_cache_memory is None or self.kv_cache_memory > 0, "kv cache memory must be positive"),
            (self.num_kv_blocks is None or self.num_kv_blocks >= 1, f"num kv blocks must be at least 1, got {self.num_kv_blocks}"),
            (self.max_model_len is None or self.max_model_len in MAX_MODEL_LEN, MAX_MODEL_LEN.message(self.max_model_len)),
            (self.max_num_seqs in MAX_NUM_SEQS, MAX_NUM_SEQS.message(self.max_num_seqs)),
            (self.max_num_batched_tokens >= self.max_num_seqs,
             f"max num batched tokens ({self.max_num_batched_tokens}) must be at least max num seqs ({self.max_num_seqs})"),
            (self.max_waiting >= 1, f"max waiting must be at least 1, got {self.max_waiting}"),
            (0 < self.default_budget_s <= MAX_BUDGET_S,
             f"default budget must be above 0 and at most {MAX_BUDGET_S:g} seconds, got {self.default_budget_s}"),
            (self.max_preemptions_per_request >= 0, "max preemptions per request must be non-negative"),
            (self.attention_backend in ATTENTION_BACKENDS,
             f"attention backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention_backend!r}"),
            (0 < self.gpu_memory_utilization <= 1,
             f"gpu memory utilization must be in (0, 1], got {self.gpu_memory_utilization}"),
            (self.tensor_parallel_size in TENSOR_PARALLEL_SIZE, TENSOR_PARALLEL_SIZE.message(self.tensor_parallel_size)),
            (self.pooling in POOLINGS, f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}"),
            (self.max_loras in MAX_LORAS, MAX_LORAS.message(self.max_loras)),
            (self.max_lora_rank in MAX_LORA_RANK, MAX_LORA_RANK.message(self.max_lora_rank)),
            (self.enable_lora or not self.lora, "--lora needs --enable-lora"),
            (self.quantization is None or self.quantization in QUANTIZATIONS,
             f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}"),
            # A row-parallel layer's int8 forward would need the all-reduce of its float one.
            (self.quantization is None or self.tensor_parallel_size == 1,
             "--quantization is not supported with --tensor-parallel-size above 1"),
            # Adapters are trained on float weights, and their deltas would be added to the int8 layers' error.
            (self.quantization is None or not self.enable_lora, "--quantization is not supported with --enable-lora"),
            (self.speculative_config is None or not self.enable_lora,
             "--speculative-config is not supported with --enable-lora"),
            (self.speculative_config is None or self.tensor_parallel_size == 1,
             "--speculative-config is not supported with --tensor-parallel-size above 1"),
            (self.speculative_config is None or not self.device.startswith("cuda"),
             "--speculative-config is supported on --device cpu only"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        _ = self.lora_modules  # refuses a malformed --lora now, not once the model has loaded

    @property
    def lora_modules(self) -> dict[str, str]:
        """The --lora adapters, name -> path."""
        modules: dict[str, str] = {}
        for entry in self.lora:
            name, sep, path = entry.partition("=") if isinstance(entry, str) else ("", "", "")
            if not (sep and name and path):
                raise ValueError(f"--lora takes NAME=PATH, got {entry!r}")
            if not re.fullmatch(LORA_NAME_PATTERN, name):
                raise ValueError(runtime_flags.lora_name_message(name))
            if name in modules:
                raise ValueError(f"--lora names {name!r} twice")
            modules[name] = path
        return modules

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add_flags(parser, "engine", EngineConfig)

    @property
    def target_itl(self) -> str | float:
        """The step budget's target: AUTO, OFF or seconds."""
        return self.target_itl_ms if isinstance(self.target_itl_ms, str) else self.target_itl_ms / 1000

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineConfig":
        return from_flags(cls, args)
