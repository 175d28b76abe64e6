"""Test harness: Sluice's runtime STANDING IN for the vLLM image, which cannot run here (no GPU, no registry).

The launcher runs a container whose image is vLLM's OpenAI server (`vllm/vllm-openai`) as
`python -m localcluster.engine_stand_in vllm ARGS...` instead of `vllm serve ARGS...`. This translates the vLLM
flags the operator writes (operator/sluice_operator/builders/vllm_args.py) into `sluice-runtime serve` flags and
replaces itself with that process. Like vLLM, the stand-in serves no `/load` (`--no-load-endpoint`), so the gateway
reads its load from `/metrics`, and takes its API key from `VLLM_API_KEY`. It exercises what Sluice does around an
engine (routing, scaling, status), not vLLM itself. A flag it does not know stops it with a message: a builder
change must be taught here before the e2e scenario passes.

    python -m localcluster.engine_stand_in vllm MODEL [--flag value ...]
"""
from __future__ import annotations

import os
import sys
import tempfile

# Image repository → engine the stand-in imitates.
STAND_IN_IMAGES = {"vllm/vllm-openai": "vllm", "docker.io/vllm/vllm-openai": "vllm"}
# The Hub repository of the embedded model, which the stand-in serves from the embedded copy.
EMBEDDED_REPOS = {"HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2"}
# vLLM flag → sluice-runtime flag, for flags taking one value passed on unchanged.
_SAME_VALUE = {
    "--host": "--host", "--port": "--port", "--served-model-name": "--served-model-name",
    "--max-model-len": "--max-model-len", "--max-num-seqs": "--max-num-seqs", "--block-size": "--block-size",
    "--dtype": "--dtype", "--gpu-memory-utilization": "--gpu-memory-utilization",
    "--tensor-parallel-size": "--tensor-parallel-size",
}


def stand_in_command(image: str) -> list[str] | None:
    """The command that stands in for this image's entrypoint, or None for an image run as it is."""
    repository = image.rsplit("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    engine = STAND_IN_IMAGES.get(repository)
    return None if engine is None else ["python", "-m", "localcluster.engine_stand_in", engine]


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


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "vllm":
        print("usage: python -m localcluster.engine_stand_in vllm ARGS...", file=sys.stderr)
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
