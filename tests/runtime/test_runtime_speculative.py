"""N-gram speculative decoding: greedy output token for token as without it, every block back, bad configs refused."""
import collections
import json
import random

import pytest

from fixtures.model import chat_prompt
from sluice_contracts import metric_names as names
from sluice_runtime.engine.llm_engine import LLMEngine
from sluice_runtime.engine.sequence import SequenceGroup
from sluice_runtime.engine.speculation import Speculator, draft_length, lookup, parse_speculative_config
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.sampling_params import SamplingParams
from sluice_runtime.server.metrics import RuntimeMetrics

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, "prompt_lookup_min": 1})


def _run(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]], steps: dict | None = None) -> list[tuple]:
    """Each request's tokens, logprobs, text and finish reason, from its streamed deltas; `steps` gets the step
    each finished at."""
    got = {}
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(f"r{i}", prompt, params)
        got[f"r{i}"] = [[], [], "", None]
    while engine.has_unfinished_requests():
        for out in engine.step():
            c, record = out.outputs[0], got[out.request_id]
            record[0] += c.delta_token_ids
            record[1] += [(lp.token_id, round(lp.logprob, 4), [t for t, _ in lp.top]) for lp in c.delta_logprobs]
            record[2] += c.delta_text
            record[3] = c.finish_reason
            if out.finished and steps is not None:
                steps[out.request_id] = engine.steps
        engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [tuple(got[f"r{i}"]) for i in range(len(requests))]


def _assert_same(got: list[tuple], reference: list[tuple]) -> None:
    """Tokens, text and finish exactly; logprobs to float32's reach, as a verification computes them in a query of
    another shape (whose summation order differs on every CPU path)."""
    assert [(g[0], g[2], g[3]) for g in got] == [(r[0], r[2], r[3]) for r in reference]
    for g, r in zip(got, reference):
        assert [(t, top) for t, _, top in g[1]] == [(t, top) for t, _, top in r[1]]
        assert max((abs(a[1] - b[1]) for a, b in zip(g[1], r[1])), default=0.0) < 1e-3


def test_greedy_output_is_identical_with_stops_logprobs_and_penalties(smollm2_tokenizer):
    tok = smollm2_tokenizer
    items = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine"
    repeat = chat_prompt(tok, f"Repeat this list exactly, nothing else: {items}.")
    prompts = [repeat, chat_prompt(tok, "Tell me about the history of Rome."), chat_prompt(tok, "def fib(n):")]
    greedy = dict(temperature=0, max_tokens=28)
    requests = [(p, SamplingParams(**greedy, logprobs=2)) for p in prompts] + [
        # A stop string inside a run of accepted drafts ends the output there.
        (repeat, SamplingParams(**greedy, stop=["grape"])),
        (repeat, SamplingParams(temperature=0, max_tokens=7)),
        (repeat, SamplingParams(**greedy, frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.1)),
        (repeat, SamplingParams(**greedy, logit_bias={tok.encode(" cherry")[0]: -100.0})),
        (repeat, SamplingParams(**greedy, min_tokens=28, ignore_eos=False)),
    ]
    # float32: bfloat16's rounding already flips near-tied greedy picks when the batch changes shape.
    config = dict(model="smollm2", dtype="float32", max_model_len=512, num_kv_blocks=64)
    plain_steps, steps = {}, {}
    reference = _run(LLMEngine(EngineConfig(**config)), requests, plain_steps)
    engine = LLMEngine(EngineConfig(**config, speculative_config=NGRAM))
    _assert_same(_run(engine, requests, steps), reference)
    assert "grape" not in reference[3][2] and reference[3][3] == "stop"
    assert len(reference[4][0]) == 7
    # The repeated list is where drafts pay: it is answered in fewer steps (how many fewer, in a batch of nine,
    # depends on what a row costs this CPU against a step).
    assert steps["r0"] < plain_steps["r0"]
    stats = engine.stats()
    assert 0 < stats.spec_decode_num_accepted_tokens <= stats.spec_decode_num_draft_tokens
    # The same counters under vLLM's names, which acceptance-rate dashboards divide.
    text = RuntimeMetrics("smollm2", engine.stats, None).render().decode()
    for name, value in ((names.SPEC_DECODE_NUM_DRAFTS, stats.spec_decode_num_drafts),
                        (names.SPEC_DECODE_NUM_DRAFT_TOKENS, stats.spec_decode_num_draft_tokens),
                        (names.SPEC_DECODE_NUM_ACCEPTED_TOKENS, stats.spec_decode_num_accepted_tokens)):
        assert f'{name}_total{{model_name="smollm2"}} {float(value)}' in text, name
    per_pos = stats.spec_decode_num_accepted_tokens_per_pos
    # A draft's position is accepted only after every one before it, and they add up to the accepted tokens.
    assert len(per_pos) == 5 and per_pos == sorted(per_pos, reverse=True) and sum(per_pos) == stats.spec_decode_num_accepted_tokens
    for position, count in enumerate(per_pos):
        assert (f'{names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS}_total{{model_name="smollm2",position="{position}"}} '
                f'{float(count)}') in text


def test_random_workload_matches_and_returns_every_block(tiny_model_dir):
    """Greedy outputs of the tiny random model (which loops, so drafts are often right) equal decoding without
    drafts, through preemptions and forks, with every block back after each step."""
    rng = random.Random(5)
    requests = []
    for _ in range(40):
        motif = [rng.randrange(100, 40000) for _ in range(rng.randint(2, 6))]
        prompt = motif * rng.randint(1, 5) + [rng.randrange(100, 40000) for _ in range(rng.randint(1, 12))]
        requests.append((prompt, SamplingParams(n=rng.choice([1, 1, 2]), temperature=0, ignore_eos=True,
                                                max_tokens=rng.randint(1, 40))))
    config = dict(model=str(tiny_model_dir), dtype="float32", block_size=4, num_kv_blocks=48, max_num_seqs=8,
                  max_num_batched_tokens=64, max_model_len=256, target_itl_ms="off")
    reference = _run(LLMEngine(EngineConfig(**config)), requests)
    engine = LLMEngine(EngineConfig(**config, speculative_config=NGRAM))
    assert _run(engine, requests) == reference
    assert engine.scheduler.num_preemptions > 0
    assert engine.num_accepted_tokens > 0


def test_seeded_sampled_output_is_identical_with_and_without_drafts(smollm2_tokenizer):
    """Each position draws with its own seeded generator, so rejected rows change nothing that follows."""
    tok = smollm2_tokenizer
    repeat = chat_prompt(tok, "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog, twice.")
    sampled = [SamplingParams(temperature=t, top_p=0.95, seed=seed, max_tokens=24, logprobs=1)
               for seed in range(4) for t in (0.3, 1.0)]
    sampled.append(SamplingParams(temperature=0.8, seed=9, n=2, max_tokens=24, frequency_penalty=0.4))
    requests = [(repeat, params) for params in sampled]
    config = dict(model="smollm2", dtype="float32", max_model_len=512, num_kv_blocks=96)
    reference = _run(LLMEngine(EngineConfig(**config)), requests)
    engine = LLMEngine(EngineConfig(**config, speculative_config=NGRAM))
    got = _run(engine, requests)
    _assert_same(got, reference)
    assert engine.num_accepted_tokens > 0, "sampled requests were drafted for"
    # The same seed alone, without the batch around it, gives the same text again.
    assert _run(engine, requests[:1])[0][0] == reference[0][0]


def _homogeneous(a: collections.Counter, b: collections.Counter) -> bool:
    """Whether Pearson's chi-square test keeps, at p=0.001, that two samples come from one distribution.
    Outcomes seen fewer than 10 times in both together are pooled into one, as the test needs."""
    keys = [key for key in set(a) | set(b) if a[key] + b[key] >= 10]
    rest = [(sum(a.values()) - sum(a[k] for k in keys), sum(b.values()) - sum(b[k] for k in keys))]
    cells = [(a[k], b[k]) for k in keys] + [r for r in rest if sum(r)]
    n_a, n_b = sum(c[0] for c in cells), sum(c[1] for c in cells)
    stat = sum((count - (x + y) * n / (n_a + n_b)) ** 2 / ((x + y) * n / (n_a + n_b))
               for x, y in cells for count, n in ((x, n_a), (y, n_b)))
    df = len(cells) - 1
    if df == 0:
        return True
    # Wilson and Hilferty's approximation of the critical value; 3.09 is the normal quantile of 0.999.
    critical = df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3
    return stat < critical


def test_sampled_tokens_keep_the_target_distribution(tiny_model_dir, monkeypatch):
    """Rejection sampling against plain decoding, unseeded, on a four-token vocabulary (top_k=4) of the random
    model at a low temperature, where about half the drafts are right. How often a token is what the n-gram
    lookup would draft there must agree (a two-proportion z-test at p=0.001): an acceptance that keeps a wrong
    draft raises it. So must every position's token frequencies (chi-square at p=0.001)."""
    motif = [4021, 880, 15003]
    prompt = motif * 6
    params = SamplingParams(temperature=0.3, top_k=4, max_tokens=5, ignore_eos=True)
    requests = [(prompt, params)] * 240
    config = dict(model=str(tiny_model_dir), dtype="float32", num_kv_blocks=512, max_num_seqs=64,
                  max_model_len=64, target_itl_ms="off")
    plain = _run(LLMEngine(EngineConfig(**config, seed=1)), requests)
    engine = LLMEngine(EngineConfig(**config, seed=2, speculative_config=NGRAM))
    # Every step drafts what it can, as where a row costs a step nothing: how many drafts a step makes is the
    # scheduler's (timed) choice, and this test needs many, whatever the machine's timings.
    monkeypatch.setattr(engine.scheduler.step_budget, "sampled_row_s", lambda: 0.0)
    drafted = _run(engine, requests)

    def hits(run) -> list[bool]:
        return [out[0][j:j + 1] == lookup(prompt + out[0][:j], 3, 1, 1) for out in run for j in range(1, 5)]

    (p_plain, p_drafted), n = [sum(h) / len(h) for h in (hits(plain), hits(drafted))], len(hits(plain))
    pooled = (p_plain + p_drafted) / 2
    z = (p_drafted - p_plain) / (2 * pooled * (1 - pooled) / n) ** 0.5
    assert abs(z) < 3.29, (p_plain, p_drafted)
    for position in range(1, 5):
        counts = [collections.Counter(out[0][position] for out in run) for run in (plain, drafted)]
        assert _homogeneous(*counts), (position, counts)
    assert 100 < engine.num_accepted_tokens < engine.num_draft_tokens


def test_lookup_proposes_what_followed_the_longest_latest_match():
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3], 3, 1, 4) == [7, 8, 5, 2]
    # No 3-gram or 2-gram repeats; the latest single token does.
    assert lookup([4, 1, 6, 1, 8, 1], 3, 1, 2) == [8, 1]
    assert lookup([4, 1, 6, 1, 8, 1], 3, 2, 2) == []
    assert lookup([1, 2, 3], 3, 1, 4) == []


def test_draft_length_is_the_positions_whose_chance_to_be_kept_pays_for_them():
    assert draft_length(0.5, 0.0, 5) == 5  # drafts cost nothing yet (no step timed)
    assert draft_length(0.5, 0.2, 5) == 2  # 0.5 and 0.25 pass, 0.125 does not
    assert draft_length(0.9, 0.03, 5) == 5 and draft_length(0.9, 0.03, 3) == 3
    assert draft_length(0.2, 0.2, 5) == 0 and draft_length(0.1, 0.5, 5) == 0
    assert draft_length(1.0, 0.9, 4) == 4


def test_drafts_shorten_while_they_miss_and_a_sequence_is_tried_again_later():
    speculator = Speculator(parse_speculative_config(NGRAM), max_model_len=200)
    seq = SequenceGroup("r", [5, 6, 7, 8, 9] * 3, SamplingParams(temperature=0, max_tokens=100)).seqs[0]
    threshold = 0.1  # a batch in which a draft must be kept one time in ten to pay for its row
    assert speculator.drafts(seq, room=16, threshold=threshold) == [5, 6, 7]  # the prior: half of them kept
    lengths = []
    while not lengths or lengths[-1]:
        drafts = speculator.drafts(seq, room=16, threshold=threshold)
        lengths.append(len(drafts))
        speculator.observe(seq, accepted=0, drafted=len(drafts)) if drafts else None
        assert len(lengths) < 20, lengths
    assert lengths[:2] == [3, 2] and lengths == sorted(lengths, reverse=True), lengths
    waited = 0
    while not speculator.drafts(seq, room=16, threshold=threshold):
        waited += 1
        assert waited < 64, "a sequence that missed is never tried again"
    assert waited > 1
    for _ in range(4):
        speculator.observe(seq, accepted=5, drafted=5)
    assert speculator.drafts(seq, room=16, threshold=threshold) == [5, 6, 7, 8, 9]  # hits bring the length back
    assert speculator.drafts(seq, room=1, threshold=threshold) == [5]
    assert speculator.drafts(seq, room=16, threshold=0.0) == [5, 6, 7, 8, 9]
    sampled = SequenceGroup("s", [5, 6, 5, 6], SamplingParams(temperature=0.7)).seqs[0]
    assert speculator.drafts(sampled, room=16) == [5, 6]


def test_a_lone_stream_drafts_more_than_each_of_a_large_batch(smollm2_tokenizer):
    engine = LLMEngine(EngineConfig(model="smollm2", speculative_config=NGRAM, max_num_seqs=64))
    items = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine"
    prompt = chat_prompt(smollm2_tokenizer, f"Repeat this list exactly, nothing else: {items}.")
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def drafts_per_row(concurrency: int) -> float:
        before = (engine.num_draft_tokens, engine.steps)
        rows = 0
        for i in range(concurrency):
            engine.add_request(f"c{concurrency}-{i}", prompt, params)
        while engine.has_unfinished_requests():
            rows += sum(1 for seq in engine.scheduler.running if not seq.is_prefilling)
            engine.step()
        return (engine.num_draft_tokens - before[0]) / rows

    drafts_per_row(4)  # times steps of several sizes
    lone, batch = drafts_per_row(1), drafts_per_row(48)
    assert lone > 1.5 and batch < lone / 2, (lone, batch)


@pytest.mark.parametrize("value, message", [
    ("{", "must be a JSON object"),
    ('{"method": "ngram"}', "missing key 'num_speculative_tokens'"),
    ('{"method": "eagle", "num_speculative_tokens": 2}', "method 'eagle' is not supported"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be at least 1, got 0"),
    ('{"method": "ngram", "num_speculative_tokens": 17}', "num_speculative_tokens must be at most 16, got 17"),
    ('{"method": "ngram", "num_speculative_tokens": "4"}', "num_speculative_tokens must be an integer"),
    ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 0}', "prompt_lookup_min must be at least 1"),
    ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 2, "prompt_lookup_min": 3}',
     "prompt_lookup_max (2) must be at least prompt_lookup_min (3)"),
    ('{"method": "ngram", "num_speculative_tokens": 4, "model": "x"}', "unknown key 'model'"),
])
def test_bad_speculative_config_is_refused_naming_the_key(value, message):
    with pytest.raises(ValueError, match="--speculative-config") as info:
        EngineConfig(speculative_config=value)
    assert message in str(info.value)


def test_lookup_bounds_default_as_vllm_and_unsupported_combinations_are_refused():
    assert parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
                                    ).prompt_lookup_min == 4
    for extra, message in ((dict(enable_lora=True), "not supported with --enable-lora"),
                           (dict(tensor_parallel_size=2), "not supported with --tensor-parallel-size above 1"),
                           (dict(device="cuda"), "supported on --device cpu only")):
        with pytest.raises(ValueError, match=f"--speculative-config is {message}"):
            EngineConfig(speculative_config=NGRAM, **extra)
