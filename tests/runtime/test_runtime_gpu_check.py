"""bench/gpu_check.py runs only on a GPU; here its pieces run on the CPU at a tiny shape, and without
CUDA it refuses with a clear message."""
import importlib.util
from pathlib import Path

import pytest
import torch

from sluice_runtime.engine.llm_engine import LLMEngine
from sluice_runtime.engine_config import EngineConfig

SCRIPT = Path(__file__).parents[2] / "bench" / "gpu_check.py"
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": True,
        "rope_theta": 10000.0}


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_says_so(gpu_check, capsys):
    assert gpu_check.main([]) == 1
    assert "needs a CUDA device" in capsys.readouterr().err


def test_random_model_measurements_and_table_on_the_cpu(gpu_check, tmp_path, smollm2_dir):
    weight_bytes = gpu_check.make_random_model_dir(tmp_path, TINY, torch.float32, "cpu", smollm2_dir)
    engine = LLMEngine(EngineConfig(model=str(tmp_path), max_model_len=64, max_num_seqs=4))
    # What a decode step reads: every parameter once (the tied embedding as the LM head).
    assert weight_bytes == sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    single = gpu_check.measure(engine, 1, 8, 5) | {"run": "tiny", "hbm_fraction": 0.5}
    batch = gpu_check.measure(engine, 3, 8, 4, seed=1) | {"run": "tiny", "x_batch1": 2.0}
    assert single["output_len"] == 5 and batch["batch"] == 3 and batch["output_tok_s"] > 0
    table = gpu_check.format_table([single, batch]).splitlines()
    assert len(table) == 4 and "50%" in table[2] and "2.0" in table[3]
