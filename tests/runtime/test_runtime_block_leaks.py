"""Property-style: whatever mix of finishes, aborts, forks and preemptions, every block comes back (and every
tenant's fairness bookkeeping goes).

Block accounting does not depend on the weights, so this runs on the tests' tiny random-weight
Llama (SmolLM2's tokenizer) to afford hundreds of requests and thousands of steps.
"""
import random

import pytest

from sluice_runtime.engine.llm_engine import LLMEngine
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.sampling_params import SamplingParams


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_workload_returns_every_block(seed, tiny_model_dir):
    rng = random.Random(seed)
    # Small blocks and a small cache: many block boundaries, forks and preemptions per request. The step-time
    # budget is off so that the schedule, and so the preemptions, follow the seed rather than this machine's speed.
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), block_size=4, num_kv_blocks=40, max_num_seqs=12, max_num_batched_tokens=96,
                                    max_model_len=256, seed=seed, target_itl_ms="off"))
    shared_prefix = [rng.randrange(100, 40000) for _ in range(12)]
    submitted, finished = 0, set()
    live: list[str] = []
    while submitted < 150 or engine.has_unfinished_requests():
        if submitted < 150 and rng.random() < 0.6:
            head = shared_prefix if rng.random() < 0.5 else []
            prompt = head + [rng.randrange(100, 40000) for _ in range(rng.randint(1, 40))]
            params = SamplingParams(n=rng.choice([1, 1, 2, 3]), max_tokens=rng.randint(1, 10),
                                    temperature=rng.choice([0.0, 1.0]), ignore_eos=rng.random() < 0.5,
                                    seed=rng.randrange(1000))
            request_id = f"r{submitted}"
            engine.add_request(request_id, prompt, params, priority=rng.randint(0, 2), tenant="abc"[submitted % 3],
                               share=(0.5, 1, 3)[submitted % 3])
            live.append(request_id)
            submitted += 1
        if live and rng.random() < 0.15:
            engine.abort(rng.choice(live))
        for out in engine.step():
            if out.finished:
                finished.add(out.request_id)
                live.remove(out.request_id)
        engine.block_manager.check_invariants()
    assert len(finished) == 150
    assert engine.scheduler.num_preemptions > 0, "the workload should have forced preemptions"
    assert engine.num_aborted > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert all(b.ref_count == 0 for b in engine.block_manager.blocks)
    assert not engine.groups
    assert not engine.scheduler.fair._levels, "an idle engine keeps no fairness state"
