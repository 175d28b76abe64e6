"""--model resolution: the embedded model converts once; bad directories fail with one clear line."""
import json
import shutil
import time

import pytest

from sluice_runtime.model_load_error import ModelLoadError
from sluice_runtime.models.loading import resolve_model, validate_model_dir


def test_embedded_model_is_converted_once(smollm2_dir):
    marker = smollm2_dir / ".complete"
    stamp = marker.stat().st_mtime_ns
    start = time.perf_counter()
    assert resolve_model("smollm2") == smollm2_dir
    assert time.perf_counter() - start < 1.0
    assert marker.stat().st_mtime_ns == stamp
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (smollm2_dir / name).is_file()
    assert json.loads((smollm2_dir / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def _copy_model(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".complete"))
    return dst


def test_unknown_architecture_is_one_clear_line(smollm2_dir, tmp_path):
    model = _copy_model(smollm2_dir, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GPTNeoXForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="unsupported architecture") as err:
        resolve_model(str(model))
    assert "\n" not in str(err.value)


def test_missing_files_are_named(smollm2_dir, tmp_path):
    model = _copy_model(smollm2_dir, tmp_path / "m")
    (model / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        validate_model_dir(model)
    with pytest.raises(ModelLoadError, match="neither an embedded model"):
        resolve_model(str(tmp_path / "nowhere"))


def test_corrupt_weights_are_reported_not_a_traceback(smollm2_dir, tmp_path):
    from sluice_runtime.engine.llm_engine import LLMEngine
    from sluice_runtime.engine_config import EngineConfig

    model = _copy_model(smollm2_dir, tmp_path / "m")
    (model / "model.safetensors").write_bytes(b"\x00" * 1024)
    with pytest.raises(ModelLoadError, match="corrupt weight file") as err:
        LLMEngine(EngineConfig(model=str(model)))
    assert "\n" not in str(err.value)


def test_auto_dtype_is_bfloat16_exactly_where_the_cpu_computes_it_natively():
    import torch

    from sluice_runtime.cpu_isa import cpu_paths
    from sluice_runtime.engine.llm import LLM
    from sluice_runtime.executor.model_runner import resolve_dtype

    native = (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()) and not cpu_paths().forced
    expected = torch.bfloat16 if native else torch.float32
    assert resolve_dtype("auto", torch.device("cpu")) == expected
    llm = LLM("smollm2", dtype="auto", num_kv_blocks=16)
    assert llm.engine.runner.dtype == expected
    assert llm.engine.runner.kv_caches[0][0].dtype == expected
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16, auto"):
        LLM("smollm2", dtype="half")
