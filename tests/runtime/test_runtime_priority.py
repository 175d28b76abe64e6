"""The engine's priority and fairness rules, as a caller sees them: who is admitted first, who is preempted, who
is shed from a full queue.

Ordering does not depend on the weights, so this runs on the tests' tiny random-weight Llama; the step-time
budget is off so that the schedule follows the requests, not this machine's speed.
"""
import pytest

from sluice_runtime.engine.errors import EngineOverloaded
from sluice_runtime.engine.llm_engine import LLMEngine
from sluice_runtime.engine.outputs import SHED
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.sampling_params import SamplingParams


def _engine(tiny_model_dir, **config) -> LLMEngine:
    settings = dict(model=str(tiny_model_dir), max_model_len=256, target_itl_ms="off", max_num_batched_tokens=256)
    return LLMEngine(EngineConfig(**{**settings, **config}))


def _params(max_tokens: int = 2) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)


def _admission_order(engine: LLMEngine) -> list[str]:
    """Run until idle; request ids in the order of their first output (with one sequence at a time and prompts
    prefilled in one step, the order they were admitted in)."""
    order: list[str] = []
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.request_id not in order]
    return order


def test_a_tenant_with_one_request_is_not_starved_by_one_with_many(tiny_model_dir):
    # One request at a time: admissions happen one by one, in the scheduler's order.
    engine = _engine(tiny_model_dir, max_num_seqs=1)
    for i in range(40):
        engine.add_request(f"flood-{i}", list(range(100, 120)), _params(), tenant="flood")
    engine.step()  # flood-0 starts; the rest of the flood is queued ahead of the next arrival
    engine.add_request("single", list(range(200, 220)), _params(), tenant="single")
    order = _admission_order(engine)
    assert order.index("single") <= 2, order[:5]


def test_shares_split_admissions_and_queue_length_does_not(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=1)
    for i in range(30):
        engine.add_request(f"big-{i}", list(range(100, 110)), _params(1), tenant="big", share=1)
    for i in range(30):
        engine.add_request(f"heavy-{i}", list(range(300, 310)), _params(1), tenant="heavy", share=2)
    first = _admission_order(engine)[:30]
    heavy = sum(r.startswith("heavy") for r in first)
    # share 2 against share 1: two admissions in three, whatever each has queued.
    assert 19 <= heavy <= 21, first


def test_priority_goes_before_fairness_and_each_tenant_keeps_its_own_order(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=1)
    engine.add_request("batch-a-0", list(range(100, 110)), _params(1), priority=10, tenant="a")
    engine.add_request("batch-a-1", list(range(100, 110)), _params(1), priority=10, tenant="a")
    engine.add_request("batch-b-0", list(range(100, 110)), _params(1), priority=10, tenant="b")
    engine.add_request("critical-c", list(range(100, 110)), _params(1), priority=-10, tenant="c")
    assert _admission_order(engine) == ["critical-c", "batch-a-0", "batch-b-0", "batch-a-1"]


def test_an_urgent_request_preempts_the_least_urgent_most_recent_running_one(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=2)
    engine.add_request("batch-old", list(range(100, 120)), _params(40), priority=10)
    engine.add_request("batch-new", list(range(100, 120)), _params(40), priority=10)
    engine.step()
    engine.step()
    engine.add_request("critical", list(range(200, 220)), _params(3), priority=-10)
    finished: list[str] = []
    for _ in range(6):  # the critical request needs a prefill and three decodes
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["critical"]
    preempted = {rid: g.metrics.num_preemptions for rid, g in engine.groups.items()}
    assert preempted == {"batch-old": 0, "batch-new": 1}
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert sorted(finished) == ["batch-new", "batch-old", "critical"]


def test_kv_shortage_preempts_by_priority_then_recency(tiny_model_dir):
    # 9 blocks of 16 tokens: four prompts of 20 tokens fit (2 blocks each); at 33 tokens each needs a third.
    engine = _engine(tiny_model_dir, num_kv_blocks=9, block_size=16, max_num_seqs=8)
    engine.add_request("critical-old", list(range(100, 120)), _params(30), priority=-10)
    engine.add_request("batch-old", list(range(200, 220)), _params(30), priority=10)
    engine.add_request("batch-new", list(range(300, 320)), _params(30), priority=10)
    engine.add_request("critical-new", list(range(400, 420)), _params(30), priority=-10)
    preempted: list[list[str]] = []  # the requests preempted so far, after each step that preempted one
    while engine.has_unfinished_requests():
        before = engine.scheduler.num_preemptions
        engine.step()
        if engine.scheduler.num_preemptions > before:
            preempted.append(sorted(rid for rid, g in engine.groups.items() if g.metrics.num_preemptions))
    assert preempted[0] == ["batch-new"]
    assert all(not rid.startswith("critical") for step in preempted for rid in step)


def test_a_full_queue_sheds_the_least_urgent_waiting_request_for_a_more_urgent_one(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=1, max_waiting=2)
    engine.add_request("batch-1", list(range(100, 110)), _params(), priority=10)
    engine.add_request("batch-2", list(range(100, 110)), _params(), priority=10)
    with pytest.raises(EngineOverloaded, match="none less urgent"):
        engine.add_request("batch-3", list(range(100, 110)), _params(), priority=10)
    engine.add_request("critical", list(range(100, 110)), _params(), priority=-10)  # batch-2 makes room
    with pytest.raises(EngineOverloaded):
        engine.add_request("batch-4", list(range(100, 110)), _params(), priority=10)
    endings = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                endings[out.request_id] = out.outputs[0].finish_reason
    assert endings == {"batch-2": SHED, "critical": "length", "batch-1": "length"}
    assert engine.stats().shed_by_priority == {10: 3}


def test_a_request_that_started_is_never_shed(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=1, max_waiting=1)
    engine.add_request("batch-running", list(range(100, 110)), _params(5), priority=10)
    engine.step()  # started: it no longer counts against the queue and can never be shed
    engine.add_request("batch-queued", list(range(100, 110)), _params(), priority=10)
    engine.add_request("critical", list(range(100, 110)), _params(), priority=-10)
    endings = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                endings[out.request_id] = out.outputs[0].finish_reason
    assert endings == {"batch-running": "length", "batch-queued": SHED, "critical": "length"}
