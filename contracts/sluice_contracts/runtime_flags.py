"""The runtime's flag limits that the InferenceModel CRD also validates, and the defaults both use.

The runtime refuses these values at start; the CRD refuses them when the object is applied, so a bad spec is
an error on `kubectl apply` rather than a pod that exits on every restart. Both read the limits from here.
"""
from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("float32", "bfloat16", "float16", "auto")
# The attention backends index blocks with shifts and masks, so a block holds a power of two of tokens.
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class IntRange:
    """Inclusive bounds of an integer flag; `name` is how messages call it."""

    name: str
    minimum: int
    maximum: int

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and self.minimum <= value <= self.maximum

    def message(self, value: object) -> str:
        """Why `value` is refused, naming the bound it crossed."""
        if isinstance(value, int) and not isinstance(value, bool):
            if value < self.minimum:
                return f"{self.name} must be at least {self.minimum}, got {value}"
            if value > self.maximum:
                return f"{self.name} must be at most {self.maximum}, got {value}"
        return f"{self.name} must be an integer from {self.minimum} to {self.maximum}, got {value!r}"


# A context shorter than a chat template's own tokens serves nothing; a million tokens is past any model here.
MAX_MODEL_LEN = IntRange("max model len", 16, 1 << 20)
MAX_NUM_SEQS = IntRange("max num seqs", 1, 4096)
TENSOR_PARALLEL_SIZE = IntRange("tensor parallel size", 1, 64)
# LoRA: adapters resident in the engine at once (others wait in CPU memory), and the largest rank it takes.
MAX_LORAS = IntRange("max loras", 1, 256)
MAX_LORA_RANK = IntRange("max lora rank", 1, 512)
# An adapter is requested by name as a model, so the name travels in JSON bodies, routing tables and metric
# labels: letters, digits and . _ - only (no commas, which separate names in vllm:lora_requests_info).
LORA_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"

# --quantization methods of the sluice engine (vLLM's names): weights quantized as the model loads.
QUANTIZATIONS = ("int8",)

# --speculative-config (vLLM's JSON keys): the draft methods built, and the most draft tokens one verification
# carries (a longer query costs a memory-bound step more than the drafts a repeated text keeps right).
SPECULATIVE_METHODS = ("ngram",)
NUM_SPECULATIVE_TOKENS = IntRange("num_speculative_tokens", 1, 16)

# The sluice engine's defaults: the runtime starts with them, and the operator passes them for a spec that leaves
# the field unset, so a pod started by hand and one the operator made serve alike.
DEFAULT_DTYPE = "float32"
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_NUM_SEQS = 64
DEFAULT_MAX_LORA_RANK = 16
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_CPU_KV_CACHE_MEMORY = "1Gi"  # on CUDA the KV cache takes what gpu memory utilization leaves


def is_block_size(value: object) -> bool:
    """An int among BLOCK_SIZES (True equals 1 in Python, but is not a block size)."""
    return isinstance(value, int) and not isinstance(value, bool) and value in BLOCK_SIZES


def block_size_message(value: object) -> str:
    return f"block size must be a power of two up to {BLOCK_SIZES[-1]}, got {value!r}"


def lora_name_message(value: object) -> str:
    return (f"LoRA adapter name must be 1 to 128 letters, digits, '.', '_' or '-' (starting with a letter or "
            f"digit), got {value!r}")


def dtype_message(value: object) -> str:
    return f"dtype must be one of {', '.join(DTYPES)}, got {value!r}"
