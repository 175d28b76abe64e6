"""Test harness: Sluice's runtime STANDING IN for the vLLM image, which cannot run here (no GPU, no registry).

The stand-in image (`STAND_IN_IMAGE`, named as one) is the runtime image with this file added as its `vllm`
command: `vllm serve MODEL ARGS...`, as the operator writes it for vLLM's image, translates the vLLM flags
(operator/sluice_operator/builders/vllm_args.py) into `sluice-runtime serve` flags and replaces itself with that
process. Like vLLM, the stand-in serves no `/load` (`--no-load-endpoint`), so the gateway reads its load from
`/metrics`, and takes its API key from `VLLM_API_KEY`. It exercises what Sluice does around an engine (routing,
scaling, status), not vLLM itself. A flag it does not know stops it with a message: a builder change must be
taught here before the e2e scenario passes.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# The image the local cluster's vLLM pods run (the chart's operator.engineImages.vllm in the e2e suite).
STAND_IN_IMAGE = "localhost/sluice-vllm-stand-in:1"
# Where the image's PATH finds it.
COMMAND_PATH = "usr/local/bin/vllm"
# The Hub repository of the embedded model, which the stand-in serves from the embedded copy.
EMBEDDED_REPOS = {"HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2"}
# vLLM flag → sluice-runtime flag, for flags taking one value passed on unchanged.
_SAME_VALUE = {
    "--host": "--host", "--port": "--port", "--served-model-name": "--served-model-name",
    "--max-model-len": "--max-model-len", "--max-num-seqs": "--max-num-seqs", "--block-size": "--block-size",
    "--dtype": "--dtype", "--gpu-memory-utilization": "--gpu-memory-utilization",
    "--tensor-parallel-size": "--tensor-parallel-size",
}


def translate_vllm(args: list[str], env: dict[str, str]) -> list[str]:
    """`vllm serve` arguments → `sluice-runtime serve` arguments (ValueError for what has no translation)."""
    if not args or args[0].startswith("-"):
        raise ValueError("vllm serve takes the model first")
    model, rest = args[0], args[1:]
    revision = None
    out = ["serve", "--no-load-endpoint", "--device", "cpu"]
    i = 0
    while i < len(rest):
        flag = rest[i]
        if flag == "--no-enable-prefix-caching":
            out.append("--no-prefix-caching")
            i += 1
            continue
        if i + 1 >= len(rest):
            raise ValueError(f"{flag} needs a value")
        value = rest[i + 1]
        if flag in _SAME_VALUE:
            out += [_SAME_VALUE[flag], value]
        elif flag == "--kv-cache-memory-bytes":
            out += ["--kv-cache-memory", value]
        elif flag == "--revision":
            revision = value
        else:
            raise ValueError(f"the vLLM stand-in does not translate {flag}")
        i += 2
    if model in EMBEDDED_REPOS:
        source = EMBEDDED_REPOS[model]
    elif model.startswith("/"):
        source = model
    else:
        source = f"hf:{model}" + (f"@{revision}" if revision else "")
    out[1:1] = ["--model", source]
    key = env.get("VLLM_API_KEY")
    if key:
        handle, path = tempfile.mkstemp(prefix="vllm-api-key-")
        with os.fdopen(handle, "w") as file:
            file.write(key)
        out += ["--api-key-file", path]
    return out


def image_files() -> dict[str, bytes]:
    """What the stand-in image adds to the runtime image: this file, as its `vllm` command."""
    # The runtime image's PATH leads to its environment's python3.
    return {COMMAND_PATH: b"#!/usr/bin/env python3\n" + Path(__file__).read_bytes()}


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print("usage: vllm serve MODEL [--flag value ...] (the vLLM stand-in)", file=sys.stderr)
        return 2
    try:
        args = translate_vllm(argv[1:], dict(os.environ))
    except ValueError as exc:
        print(f"engine stand-in: {exc}", file=sys.stderr)
        return 2
    print(f"engine stand-in: serving for the vLLM image with sluice-runtime {' '.join(args)}", file=sys.stderr,
          flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "sluice_runtime.cli", *args])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
