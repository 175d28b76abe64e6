"""LoRA adapters in the engine: greedy outputs equal transformers with the adapter merged by peft, token for
token, however requests of adapters and of the base model share steps, chunks and cached blocks."""
import pytest

from fixtures.lora import MAX_TOKENS
from sluice_runtime.engine.llm import LLM
from sluice_runtime.engine.lora_registry import LoraNotFound
from sluice_runtime.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0)


def _generate(llm: LLM, prompts, loras):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False, lora=loras)]


def _engine(lora_adapters, names, **options) -> LLM:
    llm = LLM("smollm2", enable_lora=True, **options)
    for name in names:
        llm.load_lora(name, str(lora_adapters[name].path))
    return llm


def test_one_adapter_with_chunked_prefill_and_prefix_hits_matches_peft_merged(lora_adapters, lora_prompts):
    # 32-token steps: the long prompt is prefilled in several chunks.
    llm = _engine(lora_adapters, ["sql"], max_num_batched_tokens=32, max_num_seqs=4)
    reference = lora_adapters["sql"].reference
    assert _generate(llm, lora_prompts, "sql") == reference
    hits = llm.engine.block_manager.prefix_hits
    assert _generate(llm, lora_prompts, "sql") == reference
    assert llm.engine.block_manager.prefix_hits - hits >= len(lora_prompts[-1]) - 2 * llm.engine.block_manager.block_size
    llm.engine.block_manager.check_invariants()


def test_a_mixed_batch_of_three_adapters_and_the_base_model_matches_each_reference(lora_adapters, lora_prompts,
                                                                                    base_reference):
    names = ["sql", "tone", "mlp", None]
    llm = _engine(lora_adapters, names[:3], max_loras=3, max_num_seqs=16)
    prompts = [p for _ in names for p in lora_prompts]
    loras = [name for name in names for _ in lora_prompts]
    seen_together = []
    runner_set_step = llm.engine.runner.lora.set_step

    def recording(row_adapters, num_rows, device):
        seen_together.append({adapter for adapter, _ in row_adapters})
        return runner_set_step(row_adapters, num_rows, device)

    llm.engine.runner.lora.set_step = recording
    outputs = _generate(llm, prompts, loras)
    expected = [(lora_adapters[n].reference if n else base_reference)[i] for n in names for i in range(len(lora_prompts))]
    assert outputs == expected
    assert max(len(ids) for ids in seen_together) == 4  # three adapters and the base model in one step
    assert llm.engine.runner.lora.loads == 3  # each copied into a slot once


def test_adapters_beyond_max_loras_wait_for_a_slot_and_the_base_model_does_not(lora_adapters, lora_prompts,
                                                                              base_reference):
    llm = _engine(lora_adapters, ["sql", "tone"], max_loras=1)
    engine = llm.engine
    for i, name in enumerate(["sql", "tone", None]):
        engine.add_request(f"r{i}", lora_prompts[0], PARAMS, lora=name)
    engine.step()
    stats = engine.stats()
    assert (stats.running_loras, stats.waiting_loras) == (["sql"], ["tone"])
    assert {s.group.request_id for s in engine.scheduler.running} == {"r0", "r2"}
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
    assert outputs == {"r0": lora_adapters["sql"].reference[0], "r1": lora_adapters["tone"].reference[0],
                       "r2": base_reference[0]}
    assert engine.runner.lora.loads == 2


def test_two_adapters_never_share_prefix_cache_blocks(lora_adapters, lora_prompts, base_reference):
    llm = _engine(lora_adapters, ["sql", "tone"], max_loras=2)
    blocks = llm.engine.block_manager
    long_prompt = [lora_prompts[-1]]
    assert _generate(llm, long_prompt, "sql") == [lora_adapters["sql"].reference[-1]]
    hits = blocks.prefix_hits
    assert _generate(llm, long_prompt, "tone") == [lora_adapters["tone"].reference[-1]]
    assert _generate(llm, long_prompt, None) == [base_reference[-1]]
    assert blocks.prefix_hits == hits  # same tokens, other adapters: nothing found
    assert _generate(llm, long_prompt, "tone") == [lora_adapters["tone"].reference[-1]]
    assert blocks.prefix_hits > hits  # and each finds its own


def test_an_unloaded_adapter_is_refused_but_finishes_what_it_started(lora_adapters, lora_prompts):
    llm = _engine(lora_adapters, ["sql"])
    engine = llm.engine
    engine.add_request("running", lora_prompts[0], PARAMS, lora="sql")
    engine.step()
    engine.remove_lora("sql")
    with pytest.raises(LoraNotFound, match="The lora adapter 'sql' cannot be found."):
        engine.add_request("late", lora_prompts[0], PARAMS, lora="sql")
    tokens = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = out.outputs[0].token_ids if out.finished else tokens
    assert tokens == lora_adapters["sql"].reference[0]
    assert engine.runner.lora.adapters == {} and not engine.runner.lora.resident
    # The name can be loaded again; it is a new adapter and shares nothing with the old one.
    llm.load_lora("sql", str(lora_adapters["sql"].path))
    assert _generate(llm, [lora_prompts[0]], "sql") == [lora_adapters["sql"].reference[0]]
