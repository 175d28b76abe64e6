"""Engine and server flags: the command line and Python callers get one set of defaults and one set of limits."""
import subprocess
import sys
from dataclasses import fields

import pytest

from sluice_contracts.runtime_flags import (
    BLOCK_SIZES,
    DTYPES,
    MAX_LORA_RANK,
    MAX_LORAS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    TENSOR_PARALLEL_SIZE,
)
from sluice_runtime.cli import _parser
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.server.settings import ServerSettings


def _parse(*argv):
    parser, _ = _parser()
    return parser.parse_args(["serve", *argv])


@pytest.mark.parametrize("cls", [EngineConfig, ServerSettings])
def test_no_flags_give_the_defaults_a_python_caller_gets(cls):
    assert cls.from_cli_args(_parse()) == cls()


def test_every_flag_reaches_the_config():
    args = _parse("--model", "m", "--dtype", "bfloat16", "--device", "cuda:1", "--block-size", "32",
                  "--kv-cache-memory", "2GiB", "--num-kv-blocks", "7", "--max-model-len", "4096", "--max-num-seqs", "8",
                  "--max-num-batched-tokens", "512", "--target-itl-ms", "40", "--max-waiting", "3",
                  "--no-prefix-caching", "--seed", "5", "--attention-backend", "torch", "--enforce-eager",
                  "--gpu-memory-utilization", "0.5", "--tensor-parallel-size", "2", "--enable-lora",
                  "--max-loras", "3", "--max-lora-rank", "64", "--lora", "sql=/a", "--lora", "tone=/b=c",
                  "--pooling", "last", "--default-budget-s", "12.5", "--no-deadline-admission",
                  "--host", "127.0.0.1", "--port", "0", "--served-model-name", "a", "b", "--log-prompts",
                  "--max-body-bytes", "1MiB", "--shutdown-timeout", "2", "--request-timeout", "3",
                  "--stream-idle-timeout", "4", "--print-examples")
    engine, server = EngineConfig.from_cli_args(args), ServerSettings.from_cli_args(args)
    assert engine == EngineConfig(model="m", dtype="bfloat16", device="cuda:1", block_size=32,
                                  kv_cache_memory=2 << 30, num_kv_blocks=7, max_model_len=4096, max_num_seqs=8,
                                  max_num_batched_tokens=512, target_itl_ms=40.0, max_waiting=3,
                                  enable_prefix_caching=False, seed=5, attention_backend="torch", enforce_eager=True,
                                  gpu_memory_utilization=0.5, tensor_parallel_size=2, enable_lora=True, max_loras=3,
                                  max_lora_rank=64, lora=["sql=/a", "tone=/b=c"], pooling="last",
                                  default_budget_s=12.5, deadline_admission=False)
    assert engine.lora_modules == {"sql": "/a", "tone": "/b=c"}
    assert server == ServerSettings(host="127.0.0.1", port=0, served_model_names=["a", "b"], log_prompts=True,
                                    max_body_bytes=1 << 20, shutdown_timeout=2.0, request_timeout=3.0,
                                    stream_idle_timeout=4.0, print_examples=True)
    # Changed from its default by the test above, or the test would not show the flag is read.
    untouched = {f.name for f in fields(EngineConfig) if getattr(engine, f.name) == getattr(EngineConfig(), f.name)}
    # --quantization and --speculative-config do not combine with the LoRA and tensor-parallel flags above; they
    # are read on their own.
    assert untouched == {"max_preemptions_per_request", "quantization", "speculative_config"}
    assert EngineConfig.from_cli_args(_parse("--quantization", "int8")).quantization == "int8"
    spec = EngineConfig.from_cli_args(_parse("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'))
    assert spec.speculative_config.num_speculative_tokens == 3


def test_a_parsed_list_is_not_shared_between_parses():
    first = ServerSettings.from_cli_args(_parse())
    first.served_model_names.append("leaked")
    assert ServerSettings.from_cli_args(_parse()).served_model_names == []


@pytest.mark.parametrize("field,good,bad", [
    ("block_size", BLOCK_SIZES, [0, 3, 48, 255, 512, -16, True]),
    ("dtype", DTYPES, ["int8", "FLOAT32", "", None]),
    ("max_model_len", [MAX_MODEL_LEN.minimum, MAX_MODEL_LEN.maximum, None],
     [MAX_MODEL_LEN.minimum - 1, MAX_MODEL_LEN.maximum + 1, 0, -1, True, 2048.0]),
    ("max_num_seqs", [MAX_NUM_SEQS.minimum, MAX_NUM_SEQS.maximum], [0, MAX_NUM_SEQS.maximum + 1, 8.0]),
    ("tensor_parallel_size", [TENSOR_PARALLEL_SIZE.minimum, TENSOR_PARALLEL_SIZE.maximum],
     [0, TENSOR_PARALLEL_SIZE.maximum + 1, "2"]),
    ("max_loras", [MAX_LORAS.minimum, MAX_LORAS.maximum], [0, MAX_LORAS.maximum + 1, True, "2", None]),
    ("max_lora_rank", [MAX_LORA_RANK.minimum, MAX_LORA_RANK.maximum], [0, MAX_LORA_RANK.maximum + 1, 16.0, -8]),
])
def test_the_contract_limits_are_the_engines(field, good, bad):
    extra = {"max_num_batched_tokens": MAX_NUM_SEQS.maximum}  # at least max num seqs
    for value in good:
        assert getattr(EngineConfig(**{field: value}, **extra), field) == value
    for value in bad:
        with pytest.raises(ValueError):
            EngineConfig(**{field: value}, **extra)


@pytest.mark.parametrize("argv,message", [
    (["--max-num-seqs", "4097"], "max num seqs must be at most 4096, got 4097"),
    (["--max-model-len", "8"], "max model len must be at least 16, got 8"),
    (["--tensor-parallel-size", "65"], "tensor parallel size must be at most 64, got 65"),
    (["--max-loras", "0"], "max loras must be at least 1, got 0"),
    (["--lora", "sql=/a"], "--lora needs --enable-lora"),
    (["--enable-lora", "--lora", "sql"], "--lora takes NAME=PATH, got 'sql'"),
    (["--enable-lora", "--lora", "=/a"], "--lora takes NAME=PATH, got '=/a'"),
    (["--enable-lora", "--lora", "sql=/a", "--lora", "sql=/b"], "--lora names 'sql' twice"),
    (["--enable-lora", "--lora", "a,b=/a"], "LoRA adapter name must be 1 to 128 letters"),
])
def test_the_command_line_refuses_past_the_limits_with_one_line(argv, message):
    done = subprocess.run([sys.executable, "-m", "sluice_runtime.cli", "serve", *argv], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
