"""The asyncio API the server uses: streaming, aborts that free blocks, deadlines, embeddings."""
import asyncio
import time

import pytest

from sluice_runtime.engine.async_engine import AsyncEngine
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine():
    eng = AsyncEngine.from_config(EngineConfig(num_kv_blocks=128))
    yield eng
    eng.shutdown()


async def _wait_for(predicate, timeout=30.0):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_streams_deltas_that_add_up(engine):
    prompt = engine.tokenizer.encode("The three primary colors are")
    text, tokens, last = "", [], None
    async for out in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=16), "stream"):
        text += out.outputs[0].delta_text
        tokens += out.outputs[0].delta_token_ids
        last = out
    assert last.finished and last.outputs[0].text == text and last.outputs[0].token_ids == tokens
    assert last.metrics.first_token_time >= last.metrics.arrival_time


async def test_a_reader_that_falls_behind_gets_the_unread_outputs_folded_into_one(engine):
    prompt = engine.tokenizer.encode("List the planets of the solar system:")
    stream = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), "slow-reader")
    first = await stream.__anext__()
    assert first.outputs[0].text is None and first.outputs[0].token_ids is None
    # The engine finishes all 48 tokens while nobody reads: what waits is one output, not one per step.
    await _wait_for(lambda: engine.stats().num_running == 0)
    rest = [out async for out in stream]
    assert len(rest) == 1 and rest[0].finished
    folded = rest[0].outputs[0]
    assert folded.num_tokens == 48 and len(folded.delta_token_ids) == 48 - first.outputs[0].num_tokens
    assert first.outputs[0].delta_token_ids + folded.delta_token_ids == folded.token_ids
    assert first.outputs[0].delta_text + folded.delta_text == folded.text


async def test_closing_the_stream_aborts_and_frees_blocks(engine):
    prompt = engine.tokenizer.encode("Count from one to one thousand: one, two,")
    stream = engine.generate(prompt, SamplingParams(max_tokens=500, ignore_eos=True), "leaver")
    async for _ in stream:
        assert engine.stats().kv_cache_usage > 0
        break
    await stream.aclose()
    await _wait_for(lambda: engine.stats().num_running == 0 and engine.stats().kv_cache_usage == 0)
    assert engine.stats().num_aborted >= 1


async def test_abort_by_id_ends_the_stream_with_abort(engine):
    prompt = engine.tokenizer.encode("Tell me everything about the ocean.")
    reasons = []
    async for out in engine.generate(prompt, SamplingParams(max_tokens=500, ignore_eos=True), "abort-me"):
        if out.outputs[0].num_tokens >= 2:
            engine.abort("abort-me")
            engine.abort("abort-me")  # idempotent
        reasons.append(out.outputs[0].finish_reason)
    assert reasons[-1] == "abort"
    assert engine.stats().kv_cache_usage == 0


async def test_deadline_ends_the_request_with_timeout(engine):
    prompt = engine.tokenizer.encode("Write a very long essay.")
    last = None
    async for out in engine.generate(prompt, SamplingParams(max_tokens=2000, ignore_eos=True), "late",
                                     deadline=time.time() + 0.5):
        last = out
    assert last.outputs[0].finish_reason == "timeout"
    assert len(last.outputs[0].token_ids) < 2000


async def test_embeddings_are_normalized_and_similar_texts_are_closer(engine):
    tok = engine.tokenizer
    cat, kitten, tax = await engine.embed([tok.encode(t) for t in
                                           ("A cat sleeps on the sofa.", "A kitten naps on the couch.",
                                            "Quarterly tax filing deadlines.")])
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    assert abs(dot(cat, cat) - 1) < 1e-4
    assert dot(cat, kitten) > dot(cat, tax)


async def test_work_whose_caller_left_never_ends_the_loop(engine):
    """Embeddings cancelled while their forward is queued or running (a client that left): the loop skips what
    has not started, drops what finished for nobody, and goes on serving everyone else."""
    tok = engine.tokenizer
    long_input = tok.encode("Quarterly tax filing deadlines fall in April. " * 60)
    background = engine.generate(tok.encode("Count to a thousand:"), SamplingParams(max_tokens=400, ignore_eos=True),
                                 "keeps-stepping")
    await background.__anext__()
    for delay in (0, 0, 0.01, 0.05, 0.2):
        task = asyncio.create_task(engine.embed([long_input] * 3))
        await asyncio.sleep(delay)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await background.aclose()
    # Bounded: a call queued as the loop died would wait forever.
    vector, = await asyncio.wait_for(engine.embed([tok.encode("still here")]), timeout=60)
    assert abs(sum(x * x for x in vector) - 1) < 1e-4
    assert engine.is_running
    outputs = [out async for out in engine.generate(tok.encode("Hello"), SamplingParams(temperature=0, max_tokens=3),
                                                  "after")]
    last = outputs[-1]
    assert last.finished and len(last.outputs[0].token_ids) == 3
