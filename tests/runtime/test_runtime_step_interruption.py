"""A step of batch-class work only is abandoned between layers when an online request arrives, on the real engine
(SmolLM2): the request starts in the next step, and the lines lose nothing (greedy output unchanged, no block
leaked or counted twice). A step with an online row always runs to its end."""
from __future__ import annotations

from sluice_contracts.request_priority import DEFAULT_CLASSES
from sluice_runtime.engine.llm_engine import LLMEngine
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.sampling_params import SamplingParams

BATCH = DEFAULT_CLASSES["batch"]
LINES = [f"Write one sentence about a river and a lamp, case {n}." for n in range(6)]
LONG_LINE = "Summarize the history of the harbor town in detail. " * 12


def _engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model="smollm2", max_num_batched_tokens=256, num_kv_blocks=256))


def _greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)


class ArrivalMidStep:
    """Adds a request from inside each next forward, before layer `layer` runs, one armed request per forward:
    what the server's event loop does while the engine thread computes, placed exactly."""

    def __init__(self, engine: LLMEngine, layer: int = 10):
        self.engine, self.pending = engine, []
        engine.runner.model.layers[layer].register_forward_pre_hook(self._arrive)

    def arm(self, request_id: str, prompt_ids: list[int], params: SamplingParams, priority: int) -> None:
        self.pending.append((request_id, prompt_ids, params, priority))

    def _arrive(self, module, args) -> None:
        if self.pending:
            request_id, prompt_ids, params, priority = self.pending.pop(0)
            self.engine.add_request(request_id, prompt_ids, params, priority=priority)


def _add_lines(engine: LLMEngine, texts: list[str], first: int, tokens: int = 8) -> None:
    for n, text in enumerate(texts, start=first):
        engine.add_request(f"line{n}", engine.tokenizer.encode(text), _greedy(tokens), priority=BATCH,
                           streamed=False)


def _run_batch(engine: LLMEngine, interrupt_with: ArrivalMidStep | None = None) -> tuple[dict, list[dict]]:
    """Four lines decode, then two more (one long) join them and their first step is where the chat arrives:
    the step carries decodes and prompt chunks. Returns each line's tokens and each step's outputs."""
    steps: list[dict] = []

    def step() -> None:
        steps.append({o.request_id: o for o in engine.step()})

    _add_lines(engine, LINES[:4], 0)
    step()
    step()
    _add_lines(engine, [LINES[4], LONG_LINE], 4)
    if interrupt_with is not None:
        interrupt_with.arm("chat", engine.tokenizer.encode("Name three colors."), _greedy(4),
                           DEFAULT_CLASSES["standard"])
    while engine.has_unfinished_requests():
        step()
    lines = {rid: out.outputs[0].token_ids for s in steps for rid, out in s.items()
             if rid.startswith("line") and out.finished}
    return lines, steps


def test_a_batch_only_step_is_abandoned_for_an_online_arrival_and_the_lines_lose_nothing():
    reference = _engine()
    expected, _ = _run_batch(reference)
    assert len(expected) == 6 and reference.stats().steps_interrupted == 0

    engine = _engine()
    arrival = ArrivalMidStep(engine)
    lines, steps = _run_batch(engine, arrival)
    assert engine.stats().steps_interrupted == 1
    assert lines == expected, "every line's greedy output is what it is without the interruption"
    # Steps 0 and 1 ran; step 2 was abandoned (no output); step 3 is the chat's prompt, alone.
    assert steps[2] == {}
    assert list(steps[3]) == ["chat"] and len(steps[3]["chat"].outputs[0].delta_token_ids) == 1
    blocks = engine.block_manager
    blocks.check_invariants()
    assert blocks.num_free_blocks == blocks.num_blocks, "every block came back"


def test_the_abandoned_step_counts_no_prompt_chunk_and_holds_no_block_it_did_not_compute():
    engine = _engine()
    arrival = ArrivalMidStep(engine, layer=3)
    _add_lines(engine, [LONG_LINE], 0, tokens=2)
    arrival.arm("chat", engine.tokenizer.encode("Hello"), _greedy(1), DEFAULT_CLASSES["critical"])
    assert engine.step() == [] and engine.stats().steps_interrupted == 1
    line = engine.groups["line0"]
    assert line.metrics.num_prefill_chunks == 0 and line.seqs[0].num_computed_tokens == 0
    assert line.seqs[0].block_table == [], "the blocks its chunk was given are free again"
    while engine.has_unfinished_requests():
        engine.step()
    assert line.metrics.num_prefill_chunks >= 1 and line.seqs[0].finished


def test_a_step_with_an_online_row_runs_to_its_end():
    engine = _engine()
    arrival = ArrivalMidStep(engine)
    engine.add_request("chat", engine.tokenizer.encode("Name three colors."), _greedy(6))
    engine.step()
    _add_lines(engine, LINES[:3], 0)
    engine.step()  # the lines' prompts: online requests are about, so their step is short
    arrival.arm("second-chat", engine.tokenizer.encode("Hello"), _greedy(2), DEFAULT_CLASSES["standard"])
    outputs = {o.request_id for o in engine.step()}
    assert "chat" in outputs and engine.stats().steps_interrupted == 0


def _finish(engine: LLMEngine) -> dict[str, list[int]]:
    """Steps until nothing is left; each finished request's tokens."""
    done, steps = {}, 0
    while engine.has_unfinished_requests():
        steps += 1
        assert steps < 200, "the engine made no progress"
        done.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    return done


def test_online_arrivals_in_every_forward_abandon_at_most_a_step_each_and_the_batch_still_finishes():
    reference = _engine()
    _add_lines(reference, LINES, 0)
    expected = _finish(reference)

    engine = _engine()
    arrival = ArrivalMidStep(engine)
    _add_lines(engine, LINES, 0)
    for n in range(6):  # a chat in each of the next six forwards, whichever steps they are
        arrival.arm(f"chat{n}", engine.tokenizer.encode(f"Hello number {n}"), _greedy(2), DEFAULT_CLASSES["standard"])
    done = _finish(engine)
    assert not arrival.pending and 1 <= engine.stats().steps_interrupted <= 6
    assert all(len(done[f"chat{n}"]) == 2 for n in range(6))
    assert {rid: tokens for rid, tokens in done.items() if rid.startswith("line")} == expected, \
        "every line's greedy output is what it is without the arrivals"
    engine.block_manager.check_invariants()
