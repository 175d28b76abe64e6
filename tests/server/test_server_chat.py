"""Chat and text completions through real HTTP with the official openai client."""
import base64
import math
import struct

import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "smollm2"
HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]


def chat(client, **kwargs):
    args = {"model": MODEL, "messages": HELLO, "max_tokens": 12, "temperature": 0}
    return client.chat.completions.create(**{**args, **kwargs})


def test_chat_returns_text_usage_and_request_id(runtime_openai):
    raw = runtime_openai.chat.completions.with_raw_response.create(
        model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    response = raw.parse()
    assert raw.headers["x-request-id"]
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert 0 < response.usage.completion_tokens <= 12
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens
    assert response.model == MODEL and response.object == "chat.completion"


def test_stream_matches_non_stream_and_follows_openai_framing(runtime_openai):
    expected = chat(runtime_openai).choices[0].message.content
    chunks = list(chat(runtime_openai, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason in ("stop", "length")
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(runtime_openai):
    chunks = list(chat(runtime_openai, stream=True))
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_stream_ends_with_done_marker(runtime_server):
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{runtime_server}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


def test_n_choices(runtime_openai):
    response = chat(runtime_openai, n=2, temperature=1.0, seed=7)
    assert [c.index for c in response.choices] == [0, 1]
    assert all(c.message.content for c in response.choices)
    assert 2 <= response.usage.completion_tokens <= 24


def test_streamed_n_choices_finish_once_each_and_match_non_streamed(runtime_openai):
    # With this seed one choice stops early while the others run to max_tokens.
    args = dict(n=3, temperature=1.0, seed=1, max_tokens=32, messages=[{"role": "user", "content": "Say hi."}])
    response = chat(runtime_openai, **args)
    assert len({c.finish_reason for c in response.choices}) == 2
    expected = {c.index: c.message.content for c in response.choices}
    chunks = list(chat(runtime_openai, stream=True, **args))
    finishes = [choice.index for c in chunks for choice in c.choices if choice.finish_reason]
    assert sorted(finishes) == [0, 1, 2]
    streamed = {i: "".join(choice.delta.content or "" for c in chunks for choice in c.choices if choice.index == i)
                for i in range(3)}
    assert streamed == expected


def test_logprobs_describe_the_sampled_tokens(runtime_openai):
    response = chat(runtime_openai, logprobs=True, top_logprobs=3)
    entries = response.choices[0].logprobs.content
    assert len(entries) == response.usage.completion_tokens
    assert "".join(e.token for e in entries) == response.choices[0].message.content
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        # Greedy decoding samples the most likely token.
        assert entry.top_logprobs[0].token == entry.token
        assert math.isclose(entry.top_logprobs[0].logprob, entry.logprob, abs_tol=1e-4)


def test_seed_makes_sampling_reproducible(runtime_openai):
    def sample(seed):
        return chat(runtime_openai, temperature=1.0, seed=seed, max_tokens=16).choices[0].message.content

    assert sample(1234) == sample(1234)
    assert len({sample(s) for s in (1, 2, 3)}) > 1


def test_stop_sequence_cuts_the_output(runtime_openai):
    full = chat(runtime_openai, max_tokens=24).choices[0].message.content
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    response = chat(runtime_openai, max_tokens=24, stop=[stop])
    assert response.choices[0].finish_reason == "stop"
    assert response.choices[0].message.content == full[: full.index(stop)]


def test_ignore_eos_runs_to_max_tokens(runtime_openai):
    response = chat(runtime_openai, max_tokens=20, extra_body={"ignore_eos": True})
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 20


def test_content_parts_equal_plain_content(runtime_openai):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Write one sentence"},
                                          {"type": "text", "text": "about the sea."}]}]
    joined = [{"role": "user", "content": "Write one sentence\nabout the sea."}]
    assert chat(runtime_openai, messages=parts).choices[0].message.content == \
        chat(runtime_openai, messages=joined).choices[0].message.content


def test_completions_with_several_prompts_and_echo(runtime_openai):
    response = runtime_openai.completions.create(model=MODEL, prompt=["The sky is", "Two plus two is"],
                                                 max_tokens=5, temperature=0, echo=True)
    assert [c.index for c in response.choices] == [0, 1]
    assert response.choices[0].text.startswith("The sky is")
    assert response.choices[1].text.startswith("Two plus two is")
    assert response.usage.completion_tokens <= 10


def test_completion_stream_and_logprobs(runtime_openai):
    plain = runtime_openai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                              temperature=0, logprobs=2)
    lp = plain.choices[0].logprobs
    assert "".join(lp.tokens) == plain.choices[0].text
    assert all(len(top) == 2 for top in lp.top_logprobs)
    chunks = list(runtime_openai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                                    temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def test_completion_accepts_token_ids(runtime_openai, runtime_server):
    ids = httpx.post(f"{runtime_server}/tokenize", json={"prompt": "The sky is"}).json()["tokens"]
    by_ids = runtime_openai.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    by_text = runtime_openai.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_embeddings_are_normalized_and_deterministic(runtime_openai):
    response = runtime_openai.embeddings.create(model=MODEL, input=["a red apple", "a red apple", "tax law"])
    vectors = [d.embedding for d in response.data]
    assert len(vectors) == 3 and len(vectors[0]) == 576
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-3) for v in vectors)
    assert vectors[0] == pytest.approx(vectors[1], abs=1e-5)
    similar = sum(a * b for a, b in zip(vectors[0], vectors[1]))
    different = sum(a * b for a, b in zip(vectors[0], vectors[2]))
    assert similar > different
    encoded = runtime_openai.embeddings.create(model=MODEL, input="a red apple", encoding_format="base64")
    assert response.usage.prompt_tokens > 0
    raw = encoded.data[0].embedding
    if isinstance(raw, str):
        raw = list(struct.unpack(f"<{len(base64.b64decode(raw)) // 4}f", base64.b64decode(raw)))
    assert raw == pytest.approx(vectors[0], abs=1e-5)


def test_tokenize_detokenize_round_trip(runtime_server):
    tokens = httpx.post(f"{runtime_server}/tokenize", json={"model": MODEL, "prompt": "Hello world"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 8192
    text = httpx.post(f"{runtime_server}/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]}).json()
    assert text["prompt"] == "Hello world"
    rendered = httpx.post(f"{runtime_server}/tokenize", json={"messages": HELLO}).json()
    prompt = httpx.post(f"{runtime_server}/detokenize", json={"tokens": rendered["tokens"]}).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n") and "the sea" in prompt


def test_models_report_capabilities(runtime_openai):
    models = runtime_openai.models.list().data
    assert [m.id for m in models] == [MODEL]
    card = models[0].model_extra
    assert card["max_model_len"] == 8192
    assert card["capabilities"]["tools"] and card["capabilities"]["json_schema"]
    assert not card["capabilities"]["vision"]
    assert "mean-pooled" in card["capabilities"]["embeddings"]
    assert len(card["chat_template_version"]) == 12
    assert runtime_openai.models.retrieve(MODEL).id == MODEL
