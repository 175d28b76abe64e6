"""Tensor parallelism on the CPU: ranks are processes joined over gloo on 127.0.0.1, and their
outputs must match one process token for token."""
import random

import pytest
import torch

from sluice_runtime.engine.llm import LLM
from sluice_runtime.model_load_error import ModelLoadError
from sluice_runtime.sampling_params import SamplingParams


def _run(model: str, size: int, prompts, params, **engine_args):
    llm = LLM(model, tensor_parallel_size=size, **engine_args)
    try:
        outputs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        return outputs, [x for vector in llm.embed(prompts[:2]) for x in vector]
    finally:
        llm.engine.runner.close()


def test_two_ranks_over_gloo_match_one_rank(tiny_model_dir):
    """GQA heads (4 query, 2 KV) split one KV head per rank; chunked prefill, prefix hits, seeded sampling."""
    rng = random.Random(0)
    shared = [rng.randrange(100, 40000) for _ in range(24)]
    prompts = [shared + [rng.randrange(100, 40000) for _ in range(rng.randint(1, 40))] for _ in range(6)]
    params = [SamplingParams(max_tokens=12, temperature=0 if i % 2 else 1.0, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    args = dict(block_size=4, num_kv_blocks=200, max_num_batched_tokens=48, max_num_seqs=4, max_model_len=256)
    threads = torch.get_num_threads()
    single, single_embedding = _run(str(tiny_model_dir), 1, prompts, params, **args)
    sharded, sharded_embedding = _run(str(tiny_model_dir), 2, prompts, params, **args)
    assert torch.get_num_threads() == threads  # rank 0 gave the cores it shared with its worker back
    assert sharded == single
    assert sharded_embedding == pytest.approx(single_embedding, abs=1e-5)


def test_a_size_that_does_not_divide_the_heads_is_refused():
    with pytest.raises(ModelLoadError, match="--tensor-parallel-size 2 does not divide this model's 9 attention heads"):
        LLM("smollm2", tensor_parallel_size=2)


@pytest.mark.slow
def test_smollm2_over_three_ranks_matches_one_rank(smollm2_tokenizer):
    """SmolLM2's 9 query and 3 KV heads split three ways (its head counts rule out two)."""
    from fixtures.model import chat_prompt

    prompts = [chat_prompt(smollm2_tokenizer, q) for q in ("What is the capital of France?", "Write a haiku.")]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    single, _ = _run("smollm2", 1, prompts, params, max_model_len=512)
    sharded, _ = _run("smollm2", 3, prompts, params, max_model_len=512)
    assert sharded == single
