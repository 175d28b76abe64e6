"""Greedy outputs must match Hugging Face transformers token for token, however the engine batches."""
import pytest
import torch

from fixtures.model import chat_prompt
from sluice_runtime.engine.llm import LLM
from sluice_runtime.sampling_params import SamplingParams

MAX_TOKENS = 24
SYSTEM = "You are a meticulous assistant. Answer briefly and precisely, and never invent facts. " * 3
QUESTIONS = [
    "Hi",
    "Tell me about the history of Rome, covering the republic and the empire.",
    "def fib(n):",
    "The quick brown fox " * 20,
    "List three colors.",
    "Explain quantum computing to a child. " * 5,
    "1, 2, 3, 4,",
    "Once upon a time",
    "Translate 'good morning' to French.",
]


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer):
    tok = smollm2_tokenizer
    return [tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                                    add_generation_prompt=True, tokenize=True, return_dict=False) for q in QUESTIONS]


@pytest.fixture(scope="module")
def reference(smollm2_dir, prompts):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32)
    refs = []
    with torch.inference_mode():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                 do_sample=False)
            refs.append(out[0, len(ids):].tolist())
    return refs


# min_tokens bans EOS like transformers' min_new_tokens, so both produce exactly MAX_TOKENS tokens.
PARAMS = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0)


def _generate(llm, prompts):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]


def test_concurrent_chunked_prefill_and_prefix_hits_match_transformers(prompts, reference):
    llm = LLM("smollm2", max_num_batched_tokens=48, max_num_seqs=16)
    assert _generate(llm, prompts) == reference
    hits_before = llm.engine.block_manager.prefix_hits
    # The same prompts again: every full prompt block but the last comes from the prefix cache.
    assert _generate(llm, prompts) == reference
    hits = llm.engine.block_manager.prefix_hits - hits_before
    assert hits >= sum(len(p) for p in prompts) - len(prompts) * 2 * llm.engine.block_manager.block_size
    llm.engine.block_manager.check_invariants()
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_preemption_under_a_tiny_kv_budget_matches_transformers(prompts, reference):
    longest = max(len(p) for p in prompts) + MAX_TOKENS
    llm = LLM("smollm2", num_kv_blocks=longest // 16 + 3, max_num_batched_tokens=256, enable_prefix_caching=False)
    assert _generate(llm, prompts) == reference
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_bfloat16_runs_and_agrees_on_an_easy_answer(smollm2_tokenizer):
    llm = LLM("smollm2", dtype="bfloat16")
    prompt = chat_prompt(smollm2_tokenizer, "What is the capital of France? Answer in one word.")
    out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)[0]
    assert "Paris" in out.outputs[0].text
