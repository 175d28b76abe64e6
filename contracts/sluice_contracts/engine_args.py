"""The engine flags an InferenceModel's author may add through `runtime.args`, per engine.

Everything else is refused, naming the flag. The operator already writes the flags the spec has fields for
(model, host, port, dtype, lengths, cache sizes, LoRA, credential), so none of those is here: a repeated one
would win over the operator's (argparse keeps the last) and could move the engine off loopback, past the
engine guard. Left out on purpose, whatever the engine calls them: anything that reads a file or a directory
(chat templates, configs, plugins, download or tokenizer paths), that runs code from the model repository
(`--trust-remote-code`), that logs prompts or outputs, or that sets a credential.

Each flag is a switch (`value` None) or takes one value matching `value`, given as `--flag VALUE` or
`--flag=VALUE`. Values are numbers or plain names: no '/', no leading '-', so a value can be neither a path nor
another flag. The names are the engines' own: vLLM's `vllm/engine/arg_utils.py` and
`vllm/entrypoints/openai/cli_args.py`, SGLang's `python/sglang/srt/server_args.py`, Sluice's runtime's
EngineConfig and ServerSettings.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

INTEGER = r"[0-9]{1,12}"
NUMBER = r"[0-9]{1,12}([.][0-9]{1,9})?"
# A parser, backend, quantization or policy name.
NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
# The longest item runtime.args takes: a flag and a NAME value fit well inside it.
MAX_ARG_LENGTH = 128
MAX_ARGS = 64


def _choice(*names: str) -> str:
    return "(" + "|".join(names) + ")"


@dataclass(frozen=True)
class EngineFlag:
    name: str  # with its leading '--'
    value: str | None = None  # a regular expression for the whole value; None: a switch


ALLOWED_ARGS: dict[str, tuple[EngineFlag, ...]] = {
    "sluice": (
        EngineFlag("--max-num-batched-tokens", INTEGER),
        EngineFlag("--num-kv-blocks", INTEGER),
        EngineFlag("--max-waiting", INTEGER),
        EngineFlag("--target-itl-ms", rf"(auto|off|{NUMBER})"),
        EngineFlag("--seed", INTEGER),
        EngineFlag("--attention-backend", _choice("auto", "torch", "triton", "flash-attn")),
        EngineFlag("--enforce-eager"),
        EngineFlag("--pooling", _choice("mean", "last")),
        EngineFlag("--max-body-bytes", rf"{INTEGER}(KiB|MiB|GiB)?"),
        EngineFlag("--request-timeout", NUMBER),
        EngineFlag("--stream-idle-timeout", NUMBER),
    ),
    "vllm": (
        EngineFlag("--max-num-batched-tokens", INTEGER),
        EngineFlag("--enable-chunked-prefill"),
        EngineFlag("--no-enable-chunked-prefill"),
        EngineFlag("--long-prefill-token-threshold", INTEGER),
        EngineFlag("--enforce-eager"),
        EngineFlag("--quantization", NAME),
        EngineFlag("--kv-cache-dtype", NAME),
        EngineFlag("--seed", INTEGER),
        EngineFlag("--swap-space", NUMBER),
        EngineFlag("--cpu-offload-gb", NUMBER),
        EngineFlag("--pipeline-parallel-size", INTEGER),
        EngineFlag("--enable-expert-parallel"),
        EngineFlag("--disable-custom-all-reduce"),
        EngineFlag("--scheduling-policy", _choice("fcfs", "priority")),
        EngineFlag("--max-logprobs", INTEGER),
        EngineFlag("--tokenizer-mode", _choice("auto", "slow", "mistral")),
        EngineFlag("--enable-auto-tool-choice"),
        EngineFlag("--tool-call-parser", NAME),
        EngineFlag("--reasoning-parser", NAME),
        EngineFlag("--async-scheduling"),
    ),
    "sglang": (
        EngineFlag("--chunked-prefill-size", INTEGER),
        EngineFlag("--max-prefill-tokens", INTEGER),
        EngineFlag("--max-total-tokens", INTEGER),
        EngineFlag("--schedule-policy", _choice("lpm", "random", "fcfs", "dfs-weight")),
        EngineFlag("--schedule-conservativeness", NUMBER),
        EngineFlag("--quantization", NAME),
        EngineFlag("--kv-cache-dtype", NAME),
        EngineFlag("--random-seed", INTEGER),
        EngineFlag("--attention-backend", NAME),
        EngineFlag("--disable-cuda-graph"),
        EngineFlag("--cuda-graph-max-bs", INTEGER),
        EngineFlag("--enable-torch-compile"),
        EngineFlag("--stream-interval", INTEGER),
        EngineFlag("--grammar-backend", NAME),
        EngineFlag("--tool-call-parser", NAME),
        EngineFlag("--reasoning-parser", NAME),
    ),
}


def flag_names(engine: str) -> list[str]:
    return [f.name for f in ALLOWED_ARGS[engine]]


def refused_message(engine: str, arg: str) -> str:
    """Why one item of runtime.args is refused; the API server's rules say the same."""
    return (f"runtime.args: {arg[:MAX_ARG_LENGTH]!r} is not allowed with engine {engine}; runtime.args takes only "
            f"{', '.join(flag_names(engine))} (values: numbers or plain names)")


def check_args(engine: str, args: list[str]) -> str | None:
    """None when every item of `args` is an allowed flag with a valid value; else why the first one is not."""
    flags = {f.name: f for f in ALLOWED_ARGS[engine]}
    at = 0
    while at < len(args):
        arg = args[at]
        name, equals, inline = arg.partition("=")
        flag = flags.get(name)
        if flag is None or (flag.value is None and equals):
            return refused_message(engine, arg)
        at += 1
        if flag.value is None:
            continue
        if equals:
            value = inline
        elif at < len(args):
            value = args[at]
            at += 1
        else:
            return f"runtime.args: {name} needs a value"
        if not re.fullmatch(flag.value, value):
            return f"runtime.args: {value[:MAX_ARG_LENGTH]!r} is not a valid value of {name}"
    return None
