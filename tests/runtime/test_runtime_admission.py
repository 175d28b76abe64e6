"""Deadline-aware admission: the estimate of a waiting request's first byte, the refusal of one that cannot be served
within its budget, and the end of one whose budget passed while queued.

The estimate is a pure function of what the engine measured (engine.admission), tested with figures chosen by hand;
the engine tests run the real scheduler on the tests' tiny random-weight Llama, whose steps it times itself.
"""
from __future__ import annotations

import time

import pytest

from sluice_contracts import metric_names as names
from sluice_runtime.engine import admission
from sluice_runtime.engine.admission import EngineLoad, Queued, expected_output, first_byte_s, queue_s, start_step
from sluice_runtime.engine.errors import DeadlineUnattainable, EngineOverloaded
from sluice_runtime.engine.llm_engine import LLMEngine
from sluice_runtime.engine.outputs import EXPIRED
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.sampling_params import SamplingParams

STEP, TOKEN = 0.05, 0.001


# -- the estimate ----------------------------------------------------------------------------------

def test_an_idle_engine_answers_after_the_prompt_and_one_step():
    load = EngineLoad(STEP, TOKEN, slots=4)
    assert first_byte_s(load, [], Queued(100, 16), streamed=True) == pytest.approx(100 * TOKEN + STEP)
    assert queue_s(load, []) == 0


def test_a_full_batch_makes_a_newcomer_wait_for_the_places_the_queue_ahead_leaves():
    load = EngineLoad(STEP, 0.0, slots=4, running_steps=(10, 20, 30, 40))
    # The first place frees at step 10; the request ahead holds it until 26; the next frees at 20.
    assert start_step(load, [Queued(5, 16)]) == 20
    # Four ahead take the places freeing at 10, 20, 26 and 30; the next frees at 36.
    assert start_step(load, [Queued(5, 16)] * 4) == 36
    assert first_byte_s(load, [Queued(5, 16)], Queued(5, 16), streamed=True) == pytest.approx(21 * STEP)


def test_the_queue_ahead_costs_its_prompts_and_the_running_prompts_rest():
    load = EngineLoad(STEP, TOKEN, slots=2, prefilling_tokens=300)
    ahead = [Queued(200, 1), Queued(100, 1, seqs=2)]
    # Both places are free now; the prompts ahead (200 + 100 for each of 2 sequences) and the running rest go first.
    assert first_byte_s(load, ahead, Queued(50, 8), streamed=True) == pytest.approx(
        (1 + 1) * STEP + (300 + 200 + 200 + 50) * TOKEN)


def test_a_request_read_whole_waits_for_its_own_decodes_too():
    load = EngineLoad(STEP, 0.0, slots=1)
    assert first_byte_s(load, [], Queued(1, 16), streamed=False) == pytest.approx(16 * STEP)
    assert first_byte_s(load, [], Queued(1, 16), streamed=True) == pytest.approx(STEP)


def test_each_sequence_of_a_request_takes_a_place():
    load = EngineLoad(STEP, 0.0, slots=2)
    assert start_step(load, [Queued(1, 10, seqs=2)]) == 10
    assert start_step(load, [Queued(1, 10, seqs=1)]) == 0


def test_the_expected_output_is_the_recent_mean_within_max_tokens_and_the_context():
    assert expected_output(16, 1000, None) == 16
    assert expected_output(None, 1000, None) == admission.DEFAULT_EXPECTED_OUTPUT
    assert expected_output(None, 100, None) == 100
    assert expected_output(500, 1000, 40.2) == 41
    assert expected_output(16, 1000, 40.0) == 16
    assert expected_output(None, 1000, 0.0) == 1


# -- the engine ------------------------------------------------------------------------------------

def _engine(tiny_model_dir, **config) -> LLMEngine:
    settings = dict(model=str(tiny_model_dir), max_model_len=256, target_itl_ms="off", max_num_batched_tokens=256)
    return LLMEngine(EngineConfig(**{**settings, **config}))


def _params(max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)


def _busy(engine: LLMEngine, count: int, name: str = "busy") -> None:
    """`count` requests added and the first steps run, so the engine has timed steps and a full batch."""
    for i in range(count):
        engine.add_request(f"{name}-{i}", list(range(100, 130)), _params())
    for _ in range(3):
        engine.step()


def test_the_estimate_grows_with_the_queue_ahead_and_ignores_less_urgent_requests(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=2)
    prompt, params = 30, _params()
    _busy(engine, 2)
    alone = engine.first_byte_estimate(prompt, params, 0, True)
    for i in range(10):
        engine.add_request(f"standard-{i}", list(range(100, 130)), params)
    behind_ten = engine.first_byte_estimate(prompt, params, 0, True)
    assert behind_ten > 4 * alone > 0
    for i in range(20):
        engine.add_request(f"batch-{i}", list(range(100, 130)), params, priority=10)
    # A standard newcomer queues behind the ten standard requests, not behind the batch ones after them;
    # a critical one behind none of them.
    assert engine.first_byte_estimate(prompt, params, 0, True) == pytest.approx(behind_ten, rel=0.3)
    assert engine.first_byte_estimate(prompt, params, -10, True) < behind_ten / 3
    assert engine.stats().estimated_queue_s > 0


def test_the_estimate_comes_true_within_a_factor_of_two(tiny_model_dir):
    """Thirty requests behind a batch of four: each's estimate at arrival against when its first token came."""
    engine = _engine(tiny_model_dir, max_num_seqs=4)
    _busy(engine, 8, "warm-up")
    while engine.has_unfinished_requests():  # a few dozen steps timed, as a serving engine has
        engine.step()
    _busy(engine, 4)
    first_token, estimates, arrived = {}, {}, {}
    for i in range(30):
        request_id = f"queued-{i}"
        estimates[request_id] = engine.first_byte_estimate(30, _params(), 0, True)
        arrived[request_id] = time.time()
        engine.add_request(request_id, list(range(100, 130)), _params())
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id in arrived and out.request_id not in first_token:
                first_token[out.request_id] = time.time() - arrived[out.request_id]
    late = [f"queued-{i}" for i in range(10, 30)]  # far enough back that the wait is mostly the queue's
    ratios = sorted(estimates[r] / first_token[r] for r in late)
    assert 0.5 <= ratios[len(ratios) // 2] <= 2.0, ratios


def test_a_request_that_cannot_be_answered_within_its_budget_is_refused_at_once(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=2)
    _busy(engine, 2)
    for i in range(40):
        engine.add_request(f"queued-{i}", list(range(100, 130)), _params())
    estimate = engine.first_byte_estimate(30, _params(), 0, True)
    started = time.monotonic()
    with pytest.raises(DeadlineUnattainable) as refused:
        engine.check_budget(list(range(100, 130)), _params(), 0, True, estimate / 4)
    assert time.monotonic() - started < 0.1
    assert isinstance(refused.value, EngineOverloaded) and refused.value.code == "deadline_unattainable"
    assert refused.value.retry_after_s == pytest.approx(estimate * 3 / 4, rel=0.3)
    engine.check_budget(list(range(100, 130)), _params(), 0, True, estimate * 2)  # within budget: admitted
    assert engine.stats().refused_by_reason == {names.REFUSAL_DEADLINE: 1}


def test_a_budget_that_passes_while_queued_ends_the_request_but_not_a_started_one(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=1)
    engine.add_request("running", list(range(100, 130)), _params(20))
    engine.step()
    engine.add_request("queued", list(range(100, 130)), _params(20))
    engine.expire("running")
    engine.expire("queued")
    outputs = {o.request_id: o for o in engine.step()}
    assert outputs["queued"].finished and outputs["queued"].outputs[0].finish_reason == EXPIRED
    assert not outputs["running"].finished
    assert engine.stats().refused_by_reason == {names.REFUSAL_BUDGET_PASSED: 1}
    assert "queued" not in engine.groups
    engine.expire("gone")  # unknown and finished ids are ignored
    engine.expire("queued")
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats().refused_by_reason == {names.REFUSAL_BUDGET_PASSED: 1}


def test_the_queue_bound_stays_the_hard_cap_and_is_counted_as_queue_full(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=1, max_waiting=3)
    for i in range(3):
        engine.add_request(f"queued-{i}", list(range(100, 130)), _params())
    with pytest.raises(EngineOverloaded) as refused:
        engine.add_request("one-too-many", list(range(100, 130)), _params())
    assert refused.value.code == "overloaded"
    engine.add_request("critical", list(range(100, 130)), _params(), priority=-10)  # sheds the latest standard one
    engine.step()
    assert engine.stats().refused_by_reason == {names.REFUSAL_QUEUE_FULL: 2}



@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 86401])
def test_a_default_budget_out_of_bounds_is_refused_naming_it(value):
    with pytest.raises(ValueError, match="default budget must be above 0 and at most 86400 seconds"):
        EngineConfig(default_budget_s=value)
