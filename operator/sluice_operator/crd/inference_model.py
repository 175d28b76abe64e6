"""InferenceModel: one served model, its runtime pods and how many of them to run."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_snake

from sluice_contracts import engine_args, runtime_flags
from sluice_contracts.engines import Engine
from sluice_contracts.model_tasks import DEFAULT_TASKS, TASKS, Task
from sluice_contracts.runtime_flags import (
    BLOCK_SIZES,
    DTYPES,
    MAX_LORA_RANK,
    MAX_LORAS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    NUM_SPECULATIVE_TOKENS,
    QUANTIZATIONS,
    SPECULATIVE_METHODS,
    TENSOR_PARALLEL_SIZE,
)

from .adapters import (
    MSG_ADAPTER_COUNT,
    MSG_ADAPTER_ENGINE,
    MSG_ADAPTER_RANK,
    MSG_ADAPTER_SERVED_NAME,
    Adapter,
    AdapterStatus,
)
from .base import IntOrPercent, Kind, Quantity, SpecModel, StatusModel, cel, cpu_cores
from .status import Condition, conditions_schema_extra

EMBEDDED_MODEL = "smollm2"
HF_SOURCE = re.compile(r"^hf:[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+$")
PVC_SOURCE = re.compile(r"^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+$")
KV_CACHE_PATTERN = r"^[1-9][0-9]*(Ki|Mi|Gi|Ti)$"
# An image reference as the kubelet takes it: lowercase path components without '.' or '..' of their own, then a
# tag and a digest, each optional. The release's prefixes (builders/model_policy) then apply to it.
_COMPONENT = r"[a-z0-9]([a-z0-9._-]*[a-z0-9])?"
IMAGE_REFERENCE = (rf"^{_COMPONENT}(:[0-9]+)?(/{_COMPONENT})*(:[A-Za-z0-9_][A-Za-z0-9._-]{{0,127}})?"
                   r"(@sha256:[a-f0-9]{64})?$")

# Messages shared by the CEL rules (API server) and the pydantic validators (operator, tests).
# The label a Secret carries when the platform team lets models use it as their Hugging Face token.
TOKEN_SECRET_LABEL = "sluice.dev/model-token"
TOKEN_SECRET_OPT_IN = "true"
OTEL_NAME = "^OTEL_[A-Z0-9_]+$"
MSG_OTEL_ENV = "runtime.otelEnv takes only OpenTelemetry variables: names matching OTEL_[A-Z0-9_]+"
MSG_CPU_LIMIT = "resources.cpuLimit must not be below resources.cpu (the request)"
MSG_SOURCE = "model.source must be 'smollm2', 'hf:ORG/NAME' or 'pvc://CLAIM/PATH'"
MSG_HF_ONLY = "model.revision and model.tokenSecret only apply to an 'hf:' source"
MSG_MIN_MAX = "autoscaling.minReplicas must not be above autoscaling.maxReplicas"
MSG_ZERO_NEEDS_IDLE = (
    "autoscaling.minReplicas 0 needs autoscaling.scaleToZeroAfterSeconds: the idle time after which the model "
    "scales to zero"
)
MSG_IDLE_NEEDS_ZERO = "autoscaling.scaleToZeroAfterSeconds only applies with autoscaling.minReplicas 0"
MSG_ZERO_REPLICAS = (
    "replicas 0 needs autoscaling with minReplicas 0, which starts a replica when a request arrives; "
    "without it nothing would ever serve the model"
)
MSG_TP_GPUS = "tensorParallelSize above 1 needs at least that many GPUs in resources.gpus"
MSG_ROLLOUT = "rollout.maxSurge and rollout.maxUnavailable cannot both be zero"
MSG_TASKS = f"capabilities.tasks must list each task at most once, from {', '.join(TASKS)}"
# The engines' images, pinned; runtime.image or the chart (operator flag --engine-image) overrides them.
ENGINE_IMAGES = {
    "sluice": "ghcr.io/sluice-dev/sluice-runtime:0.1.0",
    "vllm": "vllm/vllm-openai:v0.24.0",
    "sglang": "lmsysorg/sglang:v0.5.4",
}
# What the sluice engine runs with where the spec leaves a field unset (vLLM and SGLang: their own defaults).
SLUICE_DTYPE = runtime_flags.DEFAULT_DTYPE
SLUICE_KV_CACHE_MEMORY = runtime_flags.DEFAULT_CPU_KV_CACHE_MEMORY
# runtime fields (camelCase) an engine has no flag for, with what to use instead; refused at the API server.
ENGINE_UNSUPPORTED: dict[str, dict[str, str]] = {
    "sglang": {"kvCacheMemory": "SGLang sizes its KV cache from runtime.gpuMemoryUtilization (--mem-fraction-static)",
               "quantization": "SGLang reads a quantized checkpoint's own configuration; name one in model.source",
               "speculative": "SGLang's n-gram speculation takes flags of its own, not vLLM's --speculative-config"},
    "vllm": {"quantization": "vLLM reads a quantized checkpoint's own configuration; name one in model.source"},
}
MSG_QUANTIZATION_TP = "runtime.quantization is not supported with tensorParallelSize above 1"
MSG_QUANTIZATION_ADAPTERS = "runtime.quantization is not supported with adapters (they were trained on unquantized weights)"
MSG_SPECULATIVE_ADAPTERS = "runtime.speculative is not supported with adapters"
MSG_SPECULATIVE_SLUICE_CPU = ("runtime.speculative with engine sluice runs on CPU only: not with resources.gpus or "
                              "tensorParallelSize above 1")
MSG_LOOKUP_ORDER = "runtime.speculative.promptLookupMax must be at least promptLookupMin"


def msg_unsupported(engine: str, field_name: str) -> str:
    return f"runtime.{field_name} is not supported by engine {engine}: {ENGINE_UNSUPPORTED[engine][field_name]}"


def _args_rule(engine: str) -> dict[str, str]:
    """The API server's part of the runtime.args allow-list: each item is an allowed flag, `--flag=VALUE` or a
    plain value. Which flags take a value, and each value's own pattern, only the operator's check (the
    pydantic model) knows; the plain-name pattern here already keeps paths and other flags out."""
    names = engine_args.flag_names(engine)
    listed = "[" + ", ".join(f"'{n}'" for n in names) + "]"
    valued = "|".join(f.name for f in engine_args.ALLOWED_ARGS[engine] if f.value is not None)
    ok = (f"a in {listed} || a.matches('^({valued})={engine_args.NAME}$') "
          f"|| a.matches('^{engine_args.NAME}$')")
    sample = engine_args.refused_message(engine, "ARG")
    before, after = sample.split("ARG")
    return cel(f"self.engine != '{engine}' || !has(self.args) || self.args.all(a, {ok})",
               sample.replace("'ARG'", "an item"),
               message_expression=f'"{before}" + self.args.filter(a, !({ok}))[0] + "{after}"')


MSG_NAME = (
    "InferenceModel names must be at most 63 lowercase letters, digits or '-', starting with a letter, "
    "since the Service of the model takes the same name"
)


# Fields whose values the runtime takes from a fixed list, with its own message for any other.
_RUNTIME_CHOICES = {
    "dtype": (DTYPES, runtime_flags.dtype_message),
    "block_size": (BLOCK_SIZES, runtime_flags.block_size_message),
    "quantization": (QUANTIZATIONS, lambda value: f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {value!r}"),
}


@dataclass(frozen=True)
class ParsedSource:
    kind: Literal["embedded", "hf", "pvc"]
    repo: str = ""
    claim: str = ""
    path: str = ""


class SecretKeyRef(SpecModel):
    name: str = Field(description="Name of a Secret in the InferenceModel's namespace.", min_length=1, max_length=253)
    key: str = Field(default="HF_TOKEN", description="Key in the Secret holding the token.", max_length=253)


class ModelSource(SpecModel):
    source: str = Field(
        description=(
            "Where the weights come from: 'smollm2' (the embedded SmolLM2-135M-Instruct, no volume), "
            "'hf:ORG/NAME' (downloaded from the Hugging Face Hub into a cache volume) or "
            "'pvc://CLAIM/PATH' (an HF-format directory on a PersistentVolumeClaim, mounted read-only)."
        ),
        max_length=512,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self == '{EMBEDDED_MODEL}' || self.matches('{HF_SOURCE.pattern}') "
                    f"|| self.matches('{PVC_SOURCE.pattern}')",
                    MSG_SOURCE,
                )
            ]
        },
    )
    revision: str | None = Field(
        default=None, description="Branch, tag or commit of an 'hf:' source; the default branch when unset.",
        max_length=128,
    )
    token_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret with a Hugging Face token for gated or private 'hf:' repositories; only a Secret the "
                    f"platform team opened to models with the label {TOKEN_SECRET_LABEL}={TOKEN_SECRET_OPT_IN}.",
    )

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("self.source.startsWith('hf:') || (!has(self.revision) && !has(self.tokenSecret))", MSG_HF_ONLY)
            ]
        }
    }

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value != EMBEDDED_MODEL and not HF_SOURCE.match(value) and not PVC_SOURCE.match(value):
            raise ValueError(MSG_SOURCE)
        return value

    @model_validator(mode="after")
    def _hf_only_fields(self) -> "ModelSource":
        if not self.source.startswith("hf:") and (self.revision is not None or self.token_secret is not None):
            raise ValueError(MSG_HF_ONLY)
        return self

    def parsed(self) -> ParsedSource:
        if self.source == EMBEDDED_MODEL:
            return ParsedSource("embedded")
        if self.source.startswith("hf:"):
            return ParsedSource("hf", repo=self.source[3:])
        claim, _, path = self.source[len("pvc://"):].partition("/")
        return ParsedSource("pvc", claim=claim, path=path)


class SpeculativeSpec(SpecModel):
    """vLLM's --speculative-config, which the sluice engine takes too: drafts from the request's own text."""

    method: str = Field(default=SPECULATIVE_METHODS[0], json_schema_extra={"enum": list(SPECULATIVE_METHODS)},
                        description="How drafts are made: ngram, the tokens that followed the latest earlier "
                                    "occurrence of the request's last tokens (prompt lookup; no draft model).")
    num_speculative_tokens: int = Field(
        ge=NUM_SPECULATIVE_TOKENS.minimum, le=NUM_SPECULATIVE_TOKENS.maximum,
        description="The most draft tokens one step checks.")
    prompt_lookup_max: int | None = Field(
        default=None, ge=1, le=MAX_MODEL_LEN.maximum,
        description="Longest run of last tokens looked up; unset: promptLookupMin if set, else 3.")
    prompt_lookup_min: int | None = Field(
        default=None, ge=1, le=MAX_MODEL_LEN.maximum,
        description="Shortest run of last tokens looked up; unset: promptLookupMax if set, else 1.")

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("!has(self.promptLookupMax) || !has(self.promptLookupMin) "
                    "|| self.promptLookupMax >= self.promptLookupMin", MSG_LOOKUP_ORDER),
            ]
        }
    }

    @field_validator("method")
    @classmethod
    def _a_method_built(cls, value: str) -> str:
        if value not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(SPECULATIVE_METHODS)}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _lookup_order(self) -> "SpeculativeSpec":
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and high < low:
            raise ValueError(MSG_LOOKUP_ORDER)
        return self

    def flag_value(self) -> str:
        """The JSON object --speculative-config takes, with only the keys the spec sets."""
        keys = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
                "prompt_lookup_max": self.prompt_lookup_max, "prompt_lookup_min": self.prompt_lookup_min}
        return json.dumps({k: v for k, v in keys.items() if v is not None}, separators=(",", ":"))


class RuntimeSpec(SpecModel):
    engine: Engine = Field(
        default="sluice",
        description="The inference server of the pods: 'sluice' (Sluice's runtime), 'vllm' (vLLM's OpenAI server) "
                    "or 'sglang' (SGLang's server). The gateway, limits, canaries and autoscaling work the same.",
    )
    image: str | None = Field(
        default=None, min_length=1, max_length=512, pattern=IMAGE_REFERENCE,
        description="Container image, under one of the registry prefixes the release allows (the chart's "
                    "operator.allowedImagePrefixes); unset: the release's image for the engine (defaults: "
                    + ", ".join(f"{engine} {image}" for engine, image in ENGINE_IMAGES.items()) + ").",
    )
    cache_claim: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$",
        description="A PersistentVolumeClaim of the namespace mounted at the runtime's cache directory instead of "
                    "an empty one: replicas and restarts reuse converted weights, compiled kernels and Hub "
                    "downloads rather than making them again at each start (ReadWriteMany for replicas on several "
                    "nodes). Unset: each pod starts with an empty cache.",
    )
    otel_env: dict[str, str] = Field(
        default_factory=dict, max_length=32,
        description="OpenTelemetry settings of the engine, as the standard OTEL_* environment variables "
                    "(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_TRACES_SAMPLER, "
                    "OTEL_TRACES_SAMPLER_ARG, ...): spans are exported when an endpoint is named. Only OTEL_ names.",
        json_schema_extra={
            "additionalProperties": {"type": "string", "maxLength": 1024},
            "x-kubernetes-validations": [cel(f"self.all(name, name.matches('{OTEL_NAME}'))", MSG_OTEL_ENV)],
        },
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="When the kubelet pulls the image."
    )
    max_model_len: int = Field(default=2048, ge=MAX_MODEL_LEN.minimum, le=MAX_MODEL_LEN.maximum,
                               description="Longest prompt plus output, in tokens.")
    max_num_seqs: int = Field(default=runtime_flags.DEFAULT_MAX_NUM_SEQS, ge=MAX_NUM_SEQS.minimum, le=MAX_NUM_SEQS.maximum,
                              description="Most sequences decoded together in one step.")
    dtype: str | None = Field(
        default=None, json_schema_extra={"enum": list(DTYPES)},
        description=f"Weight and activation precision; float32 suits CPUs, bfloat16 most GPUs; auto: the engine "
                    f"chooses (sluice: bfloat16 where the node's hardware computes it natively, else float32). "
                    f"Unset: {SLUICE_DTYPE} for sluice, the engine's own default for vllm and sglang.",
    )
    quantization: str | None = Field(
        default=None, json_schema_extra={"enum": list(QUANTIZATIONS)},
        description="Weights quantized as the model loads (the sluice engine's --quantization): int8, with a scale "
                    "per output channel, about a third of float32's weight memory. Unset: the dtype's weights.",
    )
    speculative: SpeculativeSpec | None = Field(
        default=None,
        description="Speculative decoding (vLLM's --speculative-config, for engines sluice and vllm): each step "
                    "checks up to numSpeculativeTokens drafted tokens at once; output as without it. Pays where "
                    "answers repeat their input (edits, extraction). Unset: off.",
    )
    kv_cache_memory: str | None = Field(
        default=None, pattern=KV_CACHE_PATTERN, max_length=32,
        description=f"Memory reserved for the paged KV cache, in binary units such as 512Mi or 8Gi. Unset: "
                    f"{SLUICE_KV_CACHE_MEMORY} for sluice, what gpuMemoryUtilization leaves for vllm. "
                    f"Not for sglang.",
    )
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1,
        description="GPU pods: the share of each GPU for weights, activations and KV cache; unset: the engine's "
                    f"default (vllm, sluice {runtime_flags.DEFAULT_GPU_MEMORY_UTILIZATION}).",
    )
    block_size: int = Field(default=runtime_flags.DEFAULT_BLOCK_SIZE, json_schema_extra={"enum": list(BLOCK_SIZES)},
                            description="Tokens per KV-cache block (sglang: its page size), a power of two.")
    prefix_caching: bool = Field(default=True, description="Reuse KV-cache blocks of shared prompt prefixes.")
    max_loras: int = Field(
        default=4, ge=MAX_LORAS.minimum, le=MAX_LORAS.maximum,
        description="With adapters: LoRA adapters resident in the engine at once, and the most `adapters` may list.",
    )
    max_lora_rank: int = Field(
        default=runtime_flags.DEFAULT_MAX_LORA_RANK, ge=MAX_LORA_RANK.minimum, le=MAX_LORA_RANK.maximum,
        description="With adapters: the largest LoRA rank the runtime takes (it sizes the adapters' slots).",
    )
    startup_timeout_seconds: int = Field(
        default=600, ge=30, le=7200,
        description="How long a pod may take to load the model and warm up before it is restarted.",
    )
    args: list[str] = Field(
        default_factory=list, max_length=engine_args.MAX_ARGS,
        description="Extra engine flags appended to the operator's, from a per-engine list: "
                    + "; ".join(f"{engine}: {', '.join(engine_args.flag_names(engine))}"
                                for engine in engine_args.ALLOWED_ARGS)
                    + ". Values are numbers or plain names (no paths); anything else is refused.",
        json_schema_extra={"items": {"type": "string", "maxLength": engine_args.MAX_ARG_LENGTH}},
    )

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                *(cel(f"self.engine != '{engine}' || !has(self.{field_name})", msg_unsupported(engine, field_name))
                  for engine, fields in ENGINE_UNSUPPORTED.items() for field_name in fields),
                *(_args_rule(engine) for engine in engine_args.ALLOWED_ARGS),
            ]
        }
    }

    @model_validator(mode="after")
    def _supported_by_engine(self) -> "RuntimeSpec":
        for field_name in ENGINE_UNSUPPORTED.get(self.engine, {}):
            if getattr(self, to_snake(field_name)) is not None:
                raise ValueError(msg_unsupported(self.engine, field_name))
        return self

    @field_validator(*_RUNTIME_CHOICES)
    @classmethod
    def _a_value_the_runtime_takes(cls, value: object, info: ValidationInfo) -> object:
        choices, message = _RUNTIME_CHOICES[info.field_name]
        if value is not None and value not in choices:
            raise ValueError(message(value))
        return value

    @field_validator("otel_env")
    @classmethod
    def _only_opentelemetry(cls, value: dict[str, str]) -> dict[str, str]:
        if any(not re.match(OTEL_NAME, name) for name in value) or any(len(v) > 1024 for v in value.values()):
            raise ValueError(MSG_OTEL_ENV)
        return value

    @field_validator("args")
    @classmethod
    def _no_long_items(cls, value: list[str]) -> list[str]:
        if any(len(arg) > engine_args.MAX_ARG_LENGTH for arg in value):
            raise ValueError(f"runtime.args: each item must be at most {engine_args.MAX_ARG_LENGTH} characters")
        return value

    @model_validator(mode="after")
    def _allowed_args(self) -> "RuntimeSpec":
        refused = engine_args.check_args(self.engine, self.args)
        if refused is not None:
            raise ValueError(refused)
        return self


class Toleration(SpecModel):
    key: str | None = Field(default=None, description="Taint key; empty with Exists matches every taint.", max_length=316)
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="How key and value are compared.")
    value: str | None = Field(default=None, description="Taint value for the Equal operator.", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; all effects when unset."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="How long a NoExecute taint is tolerated before eviction."
    )


class ResourcesSpec(SpecModel):
    cpu: Quantity = Field(default="1", description="CPU request of each runtime pod, and its limit unless cpuLimit says.")
    cpu_limit: Quantity | None = Field(
        default=None,
        description="CPU limit of each runtime pod when above cpu: the pod may use idle cores up to it (Burstable), "
                    "and the engine's threads follow it. Unset: the request.",
    )
    memory: Quantity = Field(default="4Gi", description="Memory request and limit of each runtime pod.")
    gpus: int = Field(default=0, ge=0, le=64, description="nvidia.com/gpu per pod; 0 runs on CPU.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pods must match, e.g. a GPU product label."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Taints the pods tolerate, e.g. on GPU nodes."
    )

    model_config = {
        "json_schema_extra": {"x-kubernetes-validations": [
            cel("!has(self.cpuLimit) || quantity(string(self.cpuLimit)).compareTo(quantity(string(self.cpu))) >= 0",
                MSG_CPU_LIMIT),
        ]}
    }

    @model_validator(mode="after")
    def _limit_not_below_request(self) -> "ResourcesSpec":
        if self.cpu_limit is not None and cpu_cores(self.cpu_limit) < cpu_cores(self.cpu):
            raise ValueError(MSG_CPU_LIMIT)
        return self

    @property
    def cpu_ceiling(self) -> str:
        """The most CPU a pod may use: what its engine sizes its threads by."""
        return self.cpu_limit or self.cpu


class Capabilities(SpecModel):
    tools: bool = Field(default=True, description="The model handles tool calls; the gateway routes tool requests here.")
    json_schema: bool = Field(default=True, description="Structured output with a JSON schema is supported.")
    vision: bool = Field(default=False, description="The model accepts image inputs.")
    tasks: list[Task] = Field(
        default_factory=lambda: list(DEFAULT_TASKS), min_length=1, max_length=len(TASKS),
        description="Endpoints the model serves: chat (/v1/chat/completions), completion (/v1/completions), "
                    "embedding (/v1/embeddings), rerank (/v1/rerank); the gateway refuses other tasks with 400.",
        json_schema_extra={"x-kubernetes-list-type": "set", "default": list(DEFAULT_TASKS)},
    )

    @field_validator("tasks")
    @classmethod
    def _distinct(cls, tasks: list[str]) -> list[str]:
        if len(set(tasks)) != len(tasks):
            raise ValueError(MSG_TASKS)
        return tasks


class AutoscalingSpec(SpecModel):
    min_replicas: int = Field(
        default=1, ge=0, le=1000,
        description="Fewest replicas the autoscaler keeps; 0 lets an idle model scale to zero (needs "
                    "scaleToZeroAfterSeconds), and the gateway holds a request for it while a replica starts.",
    )
    max_replicas: int = Field(default=4, ge=1, le=1000, description="Most replicas the autoscaler starts.")
    target_kv_cache_usage: float = Field(
        default=0.7, gt=0, le=1, alias="targetKVCacheUsage",
        description="Mean KV-cache usage (0-1) per replica to aim for; above it the model scales up.",
    )
    target_waiting_per_replica: float = Field(
        default=4, gt=0, le=10000,
        description="Queued requests per replica to aim for; above it the model scales up.",
    )
    scale_up_window_seconds: int = Field(
        default=0, ge=0, le=3600,
        description="A scale-up takes the lowest recommendation of this window (0 scales up at once).",
    )
    scale_down_window_seconds: int = Field(
        default=300, ge=0, le=86400,
        description="A scale-down takes the highest recommendation of this window, so brief lulls do not shrink.",
    )
    scale_to_zero_after_seconds: int | None = Field(
        default=None, ge=1, le=604800,
        description="With minReplicas 0: scale to zero after this long without a request at the gateway and none "
                    "in flight.",
    )

    model_config = {
        "json_schema_extra": {"x-kubernetes-validations": [
            cel("self.minReplicas <= self.maxReplicas", MSG_MIN_MAX),
            cel("self.minReplicas > 0 || has(self.scaleToZeroAfterSeconds)", MSG_ZERO_NEEDS_IDLE),
            cel("self.minReplicas == 0 || !has(self.scaleToZeroAfterSeconds)", MSG_IDLE_NEEDS_ZERO),
        ]}
    }

    @model_validator(mode="after")
    def _ordered(self) -> "AutoscalingSpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError(MSG_MIN_MAX)
        if self.min_replicas == 0 and self.scale_to_zero_after_seconds is None:
            raise ValueError(MSG_ZERO_NEEDS_IDLE)
        if self.min_replicas > 0 and self.scale_to_zero_after_seconds is not None:
            raise ValueError(MSG_IDLE_NEEDS_ZERO)
        return self

    @property
    def scales_to_zero(self) -> bool:
        return self.min_replicas == 0


def _zero(value: int | str) -> bool:
    return str(value) in ("0", "0%")


class RolloutSpec(SpecModel):
    max_surge: IntOrPercent = Field(default=1, description="Extra pods started during a rollout (count or percent).")
    max_unavailable: IntOrPercent = Field(
        default=0, description="Pods that may be down during a rollout (count or percent); 0 keeps capacity."
    )
    termination_grace_period_seconds: int = Field(
        default=120, ge=1, le=3600,
        description="How long a stopping pod drains in-flight streams before it is killed.",
    )

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "!(string(self.maxSurge) in ['0', '0%'] && string(self.maxUnavailable) in ['0', '0%'])",
                    MSG_ROLLOUT,
                )
            ]
        }
    }

    @model_validator(mode="after")
    def _progress_possible(self) -> "RolloutSpec":
        if _zero(self.max_surge) and _zero(self.max_unavailable):
            raise ValueError(MSG_ROLLOUT)
        return self


class EndpointPickerRef(SpecModel):
    name: str = Field(description="Service of the endpoint picker (e.g. llm-d's inference scheduler) in the "
                                  "model's namespace.", min_length=1, max_length=63,
                      pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    port: int = Field(default=9002, ge=1, le=65535, description="Its gRPC (ext-proc) port.")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose", description="What the gateway does when the picker does not answer.")


class InferencePoolSpec(SpecModel):
    enabled: bool = Field(default=True, description="Create the InferencePool (false: none, whatever the chart "
                                                    "says).")
    endpoint_picker: EndpointPickerRef | None = Field(
        default=None, description="The pool's endpoint picker; unset: the chart's (inferencePool.endpointPicker).")


class InferenceModelSpec(SpecModel):
    model: ModelSource = Field(description="Where the model weights come from.")
    served_model_name: str | None = Field(
        default=None, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        description="Model name the runtime answers to in the OpenAI API; the InferenceModel's name when unset.",
    )
    runtime: RuntimeSpec = Field(
        default_factory=RuntimeSpec, description="Runtime image and engine settings.", json_schema_extra={"default": RuntimeSpec().wire()}
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="Compute of each runtime pod and where it may run.",
        json_schema_extra={"default": ResourcesSpec().wire()},
    )
    tensor_parallel_size: int = Field(default=1, ge=TENSOR_PARALLEL_SIZE.minimum, le=TENSOR_PARALLEL_SIZE.maximum,
                                      description="GPUs one replica shards the model across.")
    capabilities: Capabilities = Field(
        default_factory=Capabilities, description="What the model can do; the gateway routes by it.",
        json_schema_extra={"default": Capabilities().wire()},
    )
    replicas: int = Field(
        default=1, ge=0, le=1000,
        description="Runtime pods to run; the autoscaler sets it when autoscaling is configured (`kubectl scale` works "
                    "too); 0 only with autoscaling.minReplicas 0.",
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="Scale on KV-cache usage and queued requests; fixed replicas when unset."
    )
    pod_labels: dict[str, str] = Field(
        default_factory=dict, description="Extra labels on the runtime pods, e.g. for cost allocation or a mesh.",
    )
    pod_annotations: dict[str, str] = Field(
        default_factory=dict, description="Extra annotations on the runtime pods.",
    )
    inference_pool: InferencePoolSpec | None = Field(
        default=None,
        description="A Gateway API Inference Extension InferencePool (inference.networking.k8s.io/v1) selecting "
                    "this model's runtime pods, so a GIE gateway (Envoy Gateway, kgateway, Istio, GKE) routes to "
                    "them through an endpoint picker; unset: as the chart says (inferencePool.enabled).",
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="How a spec change replaces pods.", json_schema_extra={"default": RolloutSpec().wire()}
    )
    adapters: list[Adapter] | None = Field(
        default=None, max_length=MAX_LORAS.maximum,
        description=(
            "LoRA adapters of the model, each served under its own name. Setting this field (an empty list too) "
            "starts the runtime with LoRA on; later changes to the list are loaded and unloaded on the running "
            "replicas, without restarting them."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel("self.tensorParallelSize <= 1 || self.resources.gpus >= self.tensorParallelSize", MSG_TP_GPUS),
                cel("self.replicas > 0 || (has(self.autoscaling) && self.autoscaling.minReplicas == 0)",
                    MSG_ZERO_REPLICAS),
                cel("!has(self.adapters) || self.adapters.size() <= self.runtime.maxLoras", MSG_ADAPTER_COUNT,
                    ".adapters"),
                cel("!has(self.adapters) || self.adapters.all(a, !has(a.rank) || a.rank <= self.runtime.maxLoraRank)",
                    MSG_ADAPTER_RANK, ".adapters"),
                cel("!has(self.adapters) || self.runtime.engine != 'sglang'", MSG_ADAPTER_ENGINE, ".adapters"),
                cel("!has(self.runtime.quantization) || self.tensorParallelSize <= 1", MSG_QUANTIZATION_TP),
                cel("!has(self.runtime.quantization) || !has(self.adapters)", MSG_QUANTIZATION_ADAPTERS),
                cel("!has(self.runtime.speculative) || !has(self.adapters)", MSG_SPECULATIVE_ADAPTERS),
                cel("!has(self.runtime.speculative) || self.runtime.engine != 'sluice' "
                    "|| (self.resources.gpus == 0 && self.tensorParallelSize <= 1)", MSG_SPECULATIVE_SLUICE_CPU),
            ]
        }
    }

    def served_name(self, name: str) -> str:
        return self.served_model_name or name

    @model_validator(mode="after")
    def _enough_gpus(self) -> "InferenceModelSpec":
        if self.tensor_parallel_size > 1 and self.resources.gpus < self.tensor_parallel_size:
            raise ValueError(MSG_TP_GPUS)
        if self.runtime.quantization is not None and self.tensor_parallel_size > 1:
            raise ValueError(MSG_QUANTIZATION_TP)
        if self.runtime.quantization is not None and self.adapters is not None:
            raise ValueError(MSG_QUANTIZATION_ADAPTERS)
        if self.runtime.speculative is not None and self.adapters is not None:
            raise ValueError(MSG_SPECULATIVE_ADAPTERS)
        if (self.runtime.speculative is not None and self.runtime.engine == "sluice"
                and (self.resources.gpus or self.tensor_parallel_size > 1)):
            raise ValueError(MSG_SPECULATIVE_SLUICE_CPU)
        if self.replicas == 0 and (self.autoscaling is None or not self.autoscaling.scales_to_zero):
            raise ValueError(MSG_ZERO_REPLICAS)
        return self

    @model_validator(mode="after")
    def _adapters_fit(self) -> "InferenceModelSpec":
        adapters = self.adapters or []
        names = [a.name for a in adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"adapters: each name may appear once, got {names}")
        if len(adapters) > self.runtime.max_loras:
            raise ValueError(MSG_ADAPTER_COUNT)
        if any(a.rank is not None and a.rank > self.runtime.max_lora_rank for a in adapters):
            raise ValueError(MSG_ADAPTER_RANK)
        if self.served_model_name is not None and self.served_model_name in names:
            raise ValueError(MSG_ADAPTER_SERVED_NAME)
        if self.adapters is not None and self.runtime.engine == "sglang":
            raise ValueError(MSG_ADAPTER_ENGINE)
        return self


class AutoscalerMetrics(StatusModel):
    pods_scraped: int = Field(default=0, description="Ready pods whose /metrics answered.")
    kv_cache_usage: float | None = Field(default=None, description="Mean KV-cache usage (0-1) of the scraped pods.")
    waiting: float | None = Field(default=None, description="Queued requests summed over the scraped pods.")
    running: float | None = Field(default=None, description="Running requests summed over the scraped pods.")


class AutoscalerDecision(StatusModel):
    time: str = Field(description="When the decision was taken (RFC 3339).", max_length=64)
    action: Literal["ScaleUp", "ScaleDown", "Hold"] = Field(description="What the autoscaler did.")
    current_replicas: int = Field(description="Replicas before the decision.")
    desired_replicas: int = Field(description="Replicas after the decision.")
    reason: str = Field(description="Why, in words.", max_length=1024)
    metrics: AutoscalerMetrics = Field(default_factory=AutoscalerMetrics, description="The inputs.")


class InferencePoolStatus(StatusModel):
    name: str = Field(description="The InferencePool, named like the model.", max_length=253)
    accepted: Literal["True", "False", "Unknown"] = Field(
        description="Whether a gateway accepted the pool (its parents' Accepted conditions); Unknown until one "
                    "references it.")
    message: str = Field(default="", description="Why, in words.", max_length=1024)


class InferenceModelStatus(StatusModel):
    observed_generation: int | None = Field(default=None, description="The metadata.generation last reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing and Degraded.", json_schema_extra=conditions_schema_extra()
    )
    replicas: int | None = Field(default=None, description="Runtime pods that exist.")
    ready_replicas: int | None = Field(default=None, description="Runtime pods that pass their readiness probe.")
    endpoints: int | None = Field(default=None, description="Ready endpoints published in the routing table.")
    selector: str | None = Field(default=None, description="Label selector of the pods, for the scale subresource.")
    autoscaler: AutoscalerDecision | None = Field(default=None, description="The autoscaler's last decision.")
    inference_pool: InferencePoolStatus | None = Field(
        default=None, description="The InferencePool made for this model, and whether a gateway accepted it.")
    last_cold_start_seconds: float | None = Field(
        default=None,
        description="The last scale from zero: seconds from the first request held for the model to its first "
                    "ready endpoint.",
    )
    adapters: list[AdapterStatus] | None = Field(
        default=None, description="Each declared LoRA adapter and its state on each serving replica.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    adapters_ready: int | None = Field(
        default=None, description="Declared adapters loaded on every serving replica (and so on each endpoint).",
    )


InferenceModel = Kind(
    kind="InferenceModel",
    plural="inferencemodels",
    short_names=["im"],
    spec=InferenceModelSpec,
    status=InferenceModelStatus,
    description=(
        "A served model: Sluice runs its runtime pods (Deployment, Service, PodDisruptionBudget), "
        "publishes their ready endpoints to the gateway's routing table and scales them on load."
    ),
    columns=[
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.source"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Endpoints", "type": "integer", "jsonPath": ".status.endpoints"},
        {"name": "Adapters", "type": "integer", "jsonPath": ".status.adaptersReady"},
    ],
    root_rules=[
        cel("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')", MSG_NAME),
        cel("!has(self.spec.adapters) || self.spec.adapters.all(a, a.name != self.metadata.name && "
            "(!has(self.spec.servedModelName) || a.name != self.spec.servedModelName))",
            MSG_ADAPTER_SERVED_NAME),
    ],
    scale={
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    },
)
