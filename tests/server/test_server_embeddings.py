"""/v1/embeddings and /v1/rerank on the session's runtime server (default --pooling mean), checked against
transformers' hidden states of the same model, and every way of asking for something it cannot serve."""
import base64
import struct

import httpx
import openai
import pytest
import torch

MODEL = "smollm2"
HIDDEN = 576
TEXTS = ["A cat sleeps on the sofa.", "hi", "Quarterly tax filing deadlines fall in April. " * 40,
         "Kittens nap on the couch all afternoon.", "The mitochondria is the powerhouse of the cell.",
         "def add(a, b):\n    return a + b\n", "¿Dónde está la biblioteca? 図書館はどこですか。"]


@pytest.fixture(scope="module")
def transformers_embed(smollm2_dir, smollm2_tokenizer):
    """The reference: transformers' final hidden states of one prompt, mean-pooled and normalized, float32."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()

    def embed(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            hidden = model(torch.tensor([ids])).last_hidden_state[0]
        return torch.nn.functional.normalize(hidden.mean(dim=0), dim=0)

    return embed


def _cosines(vectors, references):
    return [float(torch.tensor(v) @ r) for v, r in zip(vectors, references)]


def test_embeddings_match_transformers_one_at_a_time_and_batched(runtime_openai, smollm2_tokenizer,
                                                                 transformers_embed):
    ids = [smollm2_tokenizer.encode(t) for t in TEXTS]
    references = [transformers_embed(i) for i in ids]
    # Long enough that the batch spans several packed forwards (a step's budget is 1,024 tokens).
    batch = runtime_openai.embeddings.create(model=MODEL, input=TEXTS * 3)
    assert [d.index for d in batch.data] == list(range(len(TEXTS) * 3))
    assert batch.usage.prompt_tokens == batch.usage.total_tokens == 3 * sum(len(i) for i in ids)
    assert min(_cosines([d.embedding for d in batch.data], references * 3)) >= 0.999
    single = [runtime_openai.embeddings.create(model=MODEL, input=t).data[0].embedding for t in TEXTS]
    assert min(_cosines(single, references)) >= 0.999
    by_ids = runtime_openai.embeddings.create(model=MODEL, input=ids)
    assert min(_cosines([d.embedding for d in by_ids.data], references)) >= 0.999
    one_id_list = runtime_openai.embeddings.create(model=MODEL, input=ids[0]).data
    assert len(one_id_list) == 1 and _cosines([one_id_list[0].embedding], references[:1])[0] >= 0.999


def test_dimensions_cut_and_renormalize_and_base64_carries_the_same_floats(runtime_openai, runtime_server):
    full = runtime_openai.embeddings.create(model=MODEL, input="a red apple").data[0].embedding
    assert len(full) == HIDDEN
    short = runtime_openai.embeddings.create(model=MODEL, input="a red apple", dimensions=64).data[0].embedding
    expected = torch.nn.functional.normalize(torch.tensor(full[:64]), dim=0)
    assert len(short) == 64 and torch.allclose(torch.tensor(short), expected, atol=1e-5)
    assert len(runtime_openai.embeddings.create(model=MODEL, input="x", dimensions=HIDDEN).data[0].embedding) == HIDDEN
    raw = httpx.post(f"{runtime_server}/v1/embeddings", timeout=60, json={
        "model": MODEL, "input": "a red apple", "dimensions": 64, "encoding_format": "base64"}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack("<64f", packed)) == pytest.approx(short, abs=1e-6)


def test_the_kv_cache_is_not_held_after_embeddings(runtime_openai, runtime_server):
    runtime_openai.embeddings.create(model=MODEL, input=TEXTS)
    load = httpx.get(f"{runtime_server}/load").json()
    assert load["kv_cache_usage"] == 0 and load["running"] == 0 and load["waiting"] == 0


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": ["fine", ""]}, "input"),
    ({"input": None}, "input"),
    ({"input": 5}, "input"),
    ({"input": [1, "a"]}, "input"),
    ({"input": [[1], ["a"]]}, "input"),
    ({"input": [True, False]}, "input"),
    ({"input": [1.5]}, "input"),
    ({"input": [10 ** 12]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": {"text": "hi"}}, "input"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": [[7] * 8000] * 40}, "input"),  # 8,000 tokens each fit the context; 320,000 together do not
    ({"input": "hi", "dimensions": HIDDEN + 1}, "dimensions"),
    ({"input": "hi", "dimensions": 0}, "dimensions"),
    ({"input": "hi", "dimensions": -3}, "dimensions"),
    ({"input": "hi", "dimensions": "64"}, "dimensions"),
    ({"input": "hi", "dimensions": 64.0}, "dimensions"),
    ({"input": "hi", "dimensions": True}, "dimensions"),
    ({"input": "hi", "dimensions": 2 ** 70}, "dimensions"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "hi", "user": 7}, "user"),
])
def test_bad_embedding_requests_get_a_400_naming_the_parameter(runtime_server, body, param):
    response = httpx.post(f"{runtime_server}/v1/embeddings", json={"model": MODEL, **body}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_too_long_an_input_is_refused_as_context_length_exceeded(runtime_openai):
    with pytest.raises(openai.BadRequestError) as info:
        runtime_openai.embeddings.create(model=MODEL, input=[[7] * 8193])
    assert info.value.body["code"] == "context_length_exceeded" and "8192" in info.value.body["message"]


def test_a_user_and_an_unknown_model(runtime_openai):
    assert runtime_openai.embeddings.create(model=MODEL, input="hi", user="alice").data
    with pytest.raises(openai.NotFoundError):
        runtime_openai.embeddings.create(model="other", input="hi")


DOCUMENTS = ["Quarterly tax filing deadlines fall in April.", "A kitten naps on the couch.",
             "The stock market closed higher today."]


def test_rerank_orders_documents_by_cosine_with_the_query(runtime_server, runtime_openai):
    query = "A cat sleeps on the sofa."
    response = httpx.post(f"{runtime_server}/v1/rerank", timeout=60,
                          json={"model": MODEL, "query": query, "documents": DOCUMENTS})
    assert response.status_code == 200, response.text
    body = response.json()
    vectors = [torch.tensor(d.embedding) for d in
               runtime_openai.embeddings.create(model=MODEL, input=[query, *DOCUMENTS]).data]
    expected = [float(vectors[0] @ v) for v in vectors[1:]]
    results = body["results"]
    assert [r["index"] for r in results] == sorted(range(3), key=lambda i: -expected[i])
    assert results[0]["index"] == 1, "the kitten is closest to the cat"
    assert [r["relevance_score"] for r in results] == pytest.approx(sorted(expected, reverse=True), abs=1e-4)
    assert all(r["document"] == {"text": DOCUMENTS[r["index"]]} for r in results)
    tokens = sum(httpx.post(f"{runtime_server}/tokenize", json={"prompt": t}).json()["count"]
                 for t in [query, *DOCUMENTS])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens} and body["model"] == MODEL
    top = httpx.post(f"{runtime_server}/v1/rerank", timeout=60, json={
        "model": MODEL, "query": query, "documents": DOCUMENTS, "top_n": 1, "return_documents": False}).json()
    assert [r["index"] for r in top["results"]] == [1] and top["results"][0].get("document") is None


@pytest.mark.parametrize("body, param", [
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": ["fine", ""]}, "documents"),
    ({"query": "", "documents": ["d"]}, "query"),
    ({"documents": ["d"]}, "query"),
    ({"query": "q"}, "documents"),
    ({"query": ["q"], "documents": ["d"]}, "query"),
    ({"query": "q", "documents": "d"}, "documents"),
    ({"query": "q", "documents": [1, 2]}, "documents"),
    ({"query": "q", "documents": [{"text": "d"}]}, "documents"),
    ({"query": "q", "documents": ["d"] * 2049}, "documents"),
    ({"query": "q", "documents": ["d"], "top_n": -1}, "top_n"),
    ({"query": "q", "documents": ["d"], "top_n": "1"}, "top_n"),
    ({"query": "q", "documents": ["d"], "return_documents": "yes"}, "return_documents"),
    ({"query": "q " * 9000, "documents": ["d"]}, "query"),
])
def test_bad_rerank_requests_get_a_400_naming_the_parameter(runtime_server, body, param):
    response = httpx.post(f"{runtime_server}/v1/rerank", json={"model": MODEL, **body}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"].split("[")[0] == param and error["message"]
