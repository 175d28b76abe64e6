"""What a user of the engine API notices: seeds, stop strings, n > 1, logprobs, admission, UTF-8."""
import math

import pytest

from fixtures.model import chat_prompt
from sluice_runtime.engine.errors import EngineOverloaded, RequestRejected
from sluice_runtime.engine.llm import LLM
from sluice_runtime.engine.llm_engine import LLMEngine
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM("smollm2", max_model_len=1024, num_kv_blocks=256)


@pytest.fixture(scope="module")
def story(llm):
    return chat_prompt(llm.tokenizer, "Write a short story about a lighthouse keeper.")


def _run(llm, prompt, **kw):
    return llm.generate([prompt], SamplingParams(**kw), use_tqdm=False)[0]


def test_same_seed_same_output_and_different_seed_differs(llm, story):
    a = _run(llm, story, temperature=1.0, top_p=0.95, max_tokens=24, seed=7)
    b = _run(llm, story, temperature=1.0, top_p=0.95, max_tokens=24, seed=7)
    c = _run(llm, story, temperature=1.0, top_p=0.95, max_tokens=24, seed=8)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert a.outputs[0].token_ids != c.outputs[0].token_ids


def test_stop_string_across_token_boundary_is_never_emitted(llm, story):
    full = _run(llm, story, temperature=0, max_tokens=40, min_tokens=40).outputs[0]
    tok = llm.tokenizer
    pieces = [tok.decode(full.token_ids[:i]) for i in range(1, len(full.token_ids) + 1)]
    # A stop string made of the end of one token and the start of the next one.
    boundary = next(i for i in range(5, len(pieces) - 1)
                    if len(pieces[i]) - len(pieces[i - 1]) >= 2 and len(pieces[i + 1]) - len(pieces[i]) >= 2)
    stop = pieces[boundary][-2:] + pieces[boundary + 1][len(pieces[boundary]):][:2]
    assert stop in full.text

    engine = llm.engine
    engine.add_request("stop-test", story, SamplingParams(temperature=0, max_tokens=40, stop=[stop]))
    streamed, final = "", None
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed += out.outputs[0].delta_text
            assert stop[:2] not in streamed[len(full.text.split(stop)[0]):] or out.finished
            final = out
    expected = full.text[: full.text.index(stop)]
    assert final.outputs[0].text == expected == streamed
    assert final.outputs[0].finish_reason == "stop" and final.outputs[0].stop_reason == stop


def test_n_sequences_share_the_prompt_blocks(llm):
    prompt = chat_prompt(llm.tokenizer, "Name a fruit. " * 30)
    engine = llm.engine
    engine.add_request("fork", prompt, SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=1))
    shared_refcounts = []
    outputs = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs = out
        group = engine.groups.get("fork")
        if group and all(s.block_table for s in group.seqs):
            shared_refcounts.append(engine.block_manager.blocks[group.seqs[0].block_table[0]].ref_count)
    assert shared_refcounts and max(shared_refcounts) >= 3
    texts = [o.text for o in outputs.outputs]
    assert len(texts) == 3 and len(set(texts)) > 1
    assert all(o.finish_reason in ("stop", "length") for o in outputs.outputs)


def test_logprobs_are_consistent(llm, story):
    result = llm.generate([story], SamplingParams(temperature=0, max_tokens=8, logprobs=5), use_tqdm=False)[0]
    engine = llm.engine
    engine_outputs = []
    engine.add_request("lp", story, SamplingParams(temperature=0, max_tokens=8, logprobs=5))
    while engine.has_unfinished_requests():
        for o in engine.step():
            engine_outputs.extend(o.outputs[0].delta_logprobs)
    assert [e.token_id for e in engine_outputs] == result.outputs[0].token_ids
    for entry in engine_outputs:
        assert len(entry.top) == 5
        values = [lp for _, lp in entry.top]
        assert values == sorted(values, reverse=True)
        assert all(v <= 0 for v in values)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-4
        # Greedy: the chosen token is the most likely one.
        assert entry.top[0][0] == entry.token_id and math.isclose(entry.top[0][1], entry.logprob, abs_tol=1e-5)


def test_incremental_text_never_breaks_utf8(llm):
    tok = llm.tokenizer
    text = "Café ☕, naïve 你好世界 🎉🚀 done"
    ids = tok.encode(text)
    engine = llm.engine
    from sluice_runtime.engine.sequence import SequenceGroup

    group = SequenceGroup("utf8", [1], SamplingParams(max_tokens=len(ids)))
    seq = group.seqs[0]
    engine.detokenizer.start(seq)
    deltas = []
    for token in ids:
        before = seq.text
        seq.token_ids.append(token)
        engine.detokenizer.append(seq)
        deltas.append(seq.text[len(before):])
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids)


def test_admission_refuses_what_can_never_fit():
    engine = LLMEngine(EngineConfig(max_model_len=256, num_kv_blocks=8, block_size=16, max_waiting=2))
    with pytest.raises(RequestRejected, match=r"300 tokens.*256"):
        engine.add_request("long", list(range(1, 301)), SamplingParams(max_tokens=1))
    with pytest.raises(RequestRejected, match="max_tokens"):
        engine.add_request("ctx", list(range(1, 101)), SamplingParams(max_tokens=200))
    with pytest.raises(RequestRejected, match="KV cache of 128 tokens"):
        engine.add_request("kv", list(range(1, 101)), SamplingParams(max_tokens=100))
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=2))
    engine.add_request("b", [1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(EngineOverloaded):
        engine.add_request("c", [1, 2, 3], SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request("c", [1, 2, 3], SamplingParams(max_tokens=2))


def test_invalid_sampling_params_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=5)


def test_priority_serves_the_urgent_request_first():
    engine = LLMEngine(EngineConfig(max_num_seqs=1, max_num_batched_tokens=64, num_kv_blocks=64))
    engine.add_request("bulk-1", list(range(10, 40)), SamplingParams(max_tokens=3, ignore_eos=True), priority=5)
    engine.add_request("bulk-2", list(range(10, 40)), SamplingParams(max_tokens=3, ignore_eos=True), priority=5)
    engine.add_request("urgent", list(range(50, 80)), SamplingParams(max_tokens=3, ignore_eos=True), priority=0)
    order = []
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.finished]
    assert order[0] == "urgent"


def test_a_prompt_longer_than_the_step_budget_is_prefilled_in_chunks_the_request_counts():
    engine = LLMEngine(EngineConfig(max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=64, target_itl_ms="off"))
    engine.add_request("long", list(range(10, 210)), SamplingParams(max_tokens=2, ignore_eos=True))
    engine.add_request("short", list(range(10, 40)), SamplingParams(max_tokens=2, ignore_eos=True))
    ended = {}
    while engine.has_unfinished_requests():
        ended |= {o.request_id: o.metrics for o in engine.step() if o.finished}
    assert ended["short"].num_prefill_chunks == 1
    assert ended["long"].num_prefill_chunks == 4  # 200 prompt tokens, at most 64 a step


def test_an_offline_batch_larger_than_the_online_queue_bound_is_generated_whole():
    llm = LLM("smollm2", max_waiting=3, max_num_seqs=2)
    prompts = [[10 + n, 20, 30] for n in range(8)]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert all(len(o.outputs[0].token_ids) == 2 for o in outputs)
