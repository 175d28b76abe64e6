"""Engine settings: one dataclass, its CLI flags and their validation."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, fields

from .step_budget import AUTO, OFF

# The names executor.attention.BACKENDS accepts, repeated so parsing flags does not import torch.
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash-attn")
DTYPES = ("float32", "bfloat16", "float16", "auto")
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
    model: str = "smollm2"
    dtype: str = "float32"
    device: str = "cpu"
    # Rounded up to what the attention backend reads (a multiple of 256 tokens for flash-attn).
    block_size: int = 16
    # The replica's budget, all tensor-parallel ranks together. None: 1 GiB on the CPU; on CUDA
    # whatever --gpu-memory-utilization leaves (a value given on CUDA caps that).
    kv_cache_memory: int | None = None
    # Overrides kv_cache_memory when set.
    num_kv_blocks: int | None = None
    # None: the model's own context length.
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    # While requests decode, a step carrying prefill takes at most this long: "auto" (twice the
    # decode-only step at the current batch; engine/step_budget.py), "off", or milliseconds.
    target_itl_ms: str | float = "auto"
    max_waiting: int = 1024
    enable_prefix_caching: bool = True
    # A request preempted this often is no longer chosen as a victim, so it cannot livelock.
    max_preemptions_per_request: int = 4
    seed: int = 0
    # auto: flash-attn where importable on CUDA, else Triton on CUDA, else torch.
    attention_backend: str = "auto"
    # CUDA only: no decode CUDA graphs.
    enforce_eager: bool = False
    # CUDA only: the share of the device the weights, activations and KV cache may use.
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_memory(self.kv_cache_memory)
        self.target_itl_ms = parse_target_itl(self.target_itl_ms)
        checks = [
            (self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"),
            (self.block_size in (1, 2, 4, 8, 16, 32, 64, 128, 256), f"block size must be a power of two up to 256, got {self.block_size}"),
            (self.kv_cache_memory is None or self.kv_cache_memory > 0, "kv cache memory must be positive"),
            (self.num_kv_blocks is None or self.num_kv_blocks >= 1, f"num kv blocks must be at least 1, got {self.num_kv_blocks}"),
            (self.max_model_len is None or self.max_model_len >= 1, f"max model len must be at least 1, got {self.max_model_len}"),
            (self.max_num_seqs >= 1, f"max num seqs must be at least 1, got {self.max_num_seqs}"),
            (self.max_num_batched_tokens >= self.max_num_seqs,
             f"max num batched tokens ({self.max_num_batched_tokens}) must be at least max num seqs ({self.max_num_seqs})"),
            (self.max_waiting >= 1, f"max waiting must be at least 1, got {self.max_waiting}"),
            (self.max_preemptions_per_request >= 0, "max preemptions per request must be non-negative"),
            (self.attention_backend in ATTENTION_BACKENDS,
             f"attention backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention_backend!r}"),
            (0 < self.gpu_memory_utilization <= 1,
             f"gpu memory utilization must be in (0, 1], got {self.gpu_memory_utilization}"),
            (self.tensor_parallel_size >= 1, f"tensor parallel size must be at least 1, got {self.tensor_parallel_size}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("engine")
        group.add_argument("--model", default="smollm2",
                           help="'smollm2' (embedded default), a local HF model directory, or hf:ORG/NAME")
        group.add_argument("--dtype", default="float32", choices=DTYPES,
                           help="weights, activations and KV cache; auto: bfloat16 where the hardware computes it "
                                "natively (CUDA, CPUs with AVX512-BF16 or AMX), else float32 (float16 on old GPUs)")
        group.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
        group.add_argument("--block-size", type=int, default=16,
                           help="tokens per KV-cache block (rounded up to a multiple of 256 for flash-attn)")
        group.add_argument("--kv-cache-memory", default=None,
                           help="KV-cache budget of the replica, e.g. 512MiB or 2GiB (default: 1GiB on the CPU; on "
                                "CUDA what --gpu-memory-utilization leaves, which a value given here caps)")
        group.add_argument("--num-kv-blocks", type=int, default=None, help="KV-cache size in blocks; overrides --kv-cache-memory")
        group.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
        group.add_argument("--max-num-seqs", type=int, default=64, help="most sequences in one batch")
        group.add_argument("--max-num-batched-tokens", type=int, default=1024, help="token budget of one engine step")
        group.add_argument("--target-itl-ms", default="auto",
                           help="while requests decode, a step carrying prompt chunks takes at most this long: auto "
                                "(twice the decode-only step, measured as the engine runs), off (token budget only), "
                                "or milliseconds")
        group.add_argument("--max-waiting", type=int, default=1024, help="queued requests before new ones are refused as overloaded")
        group.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                           help="disable reuse of cached prompt blocks")
        group.add_argument("--seed", type=int, default=0)
        group.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                           help="attention kernels; auto: flash-attn if importable on CUDA, else triton on CUDA, "
                                "else torch")
        group.add_argument("--enforce-eager", action="store_true", help="CUDA: run decode steps without CUDA graphs")
        group.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                           help="CUDA: share of each GPU for weights, activations and the KV cache, sized at start")
        group.add_argument("--tensor-parallel-size", type=int, default=1,
                           help="shard the model across this many GPUs (processes on the CPU)")

    @property
    def target_itl(self) -> str | float:
        """The step budget's target: AUTO, OFF or seconds."""
        return self.target_itl_ms if isinstance(self.target_itl_ms, str) else self.target_itl_ms / 1000

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})
