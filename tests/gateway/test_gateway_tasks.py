"""/v1/embeddings and /v1/rerank through the gateway in front of real runtimes: routed like chat (auth, allow-list,
token limits, weights, fallbacks) to the backends whose capabilities list the task, and refused with 400 where
a route's model serves no such task."""
import httpx
import openai
import pytest

from fixtures.gateway import TINY_CONTEXT, TINY_MODEL_NAME, backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

ALICE, BOB = "sk-test-alice-tasks", "sk-test-bob-tasks"
CHAT = [{"role": "user", "content": "Say hello."}]
RERANK = {"query": "a cat", "documents": ["a kitten", "tax law", "a dog"]}


def _serving(name, url, tasks, weight=1):
    entry = backend(name, url, weight=weight)
    entry["capabilities"] = {"tasks": tasks}
    return entry


@pytest.fixture(scope="module")
def gateway(tiny_runtimes, tmp_path_factory):
    from fixtures.gateway import run_gateway

    a, _ = tiny_runtimes
    config = gateway_config([
        {"name": "alice", "keys": [key_entry("alice-key", ALICE)], "models": ["*"],
         "limits": {"tokens_per_minute": 100000}},
        {"name": "bob", "keys": [key_entry("bob-key", BOB)], "models": ["chat-only"]},
    ])
    routes = table(**{
        "everything": {"backends": [backend("tiny-all", a.url, max_model_len=TINY_CONTEXT)]},
        "chat-only": {"backends": [_serving("tiny-chat", a.url, ["chat", "completion"])]},
        "embed-only": {"backends": [_serving("tiny-embed", a.url, ["embedding", "rerank"])]},
        "mixed": {"backends": [_serving("tiny-chat", a.url, ["chat", "completion"], weight=90),
                               _serving("tiny-embed", a.url, ["embedding", "rerank"], weight=10)]},
        "chat-then-embed": {"backends": [_serving("tiny-chat", a.url, ["chat", "completion"])],
                            "fallbacks": ["embed-only"]},
    })
    with run_gateway(config, routes, tmp_path_factory.mktemp("gateway-tasks")) as gw:
        yield gw


def _post(gateway, path, body, key=ALICE, request_id=None):
    headers = {"authorization": f"Bearer {key}"}
    if request_id:
        headers["x-request-id"] = request_id
    return httpx.post(f"{gateway.url}{path}", json=body, headers=headers, timeout=60)


def test_embeddings_and_rerank_pass_through_unchanged(gateway, tiny_runtimes):
    a, _ = tiny_runtimes
    through = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=ALICE, max_retries=0, timeout=60)
    direct = openai.OpenAI(base_url=f"{a.url}/v1", api_key="unused", max_retries=0, timeout=60)
    routed = through.embeddings.create(model="everything", input=["a cat", "tax law"], dimensions=16)
    served = direct.embeddings.create(model=TINY_MODEL_NAME, input=["a cat", "tax law"], dimensions=16)
    assert [d.embedding for d in routed.data] == [d.embedding for d in served.data]
    assert routed.usage.prompt_tokens == served.usage.prompt_tokens > 0
    reranked = _post(gateway, "/v1/rerank", {"model": "everything", **RERANK})
    assert reranked.status_code == 200, reranked.text
    assert sorted(r["index"] for r in reranked.json()["results"]) == [0, 1, 2]


@pytest.mark.parametrize("path, body, model", [
    ("/v1/embeddings", {"input": "hi"}, "chat-only"),
    ("/v1/rerank", RERANK, "chat-only"),
    ("/v1/embeddings", {"input": "hi"}, "tiny-chat"),  # the backend's own name leads to the same model
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}, "embed-only"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}, "tiny-embed"),
])
def test_a_task_the_model_does_not_serve_is_refused_with_400(gateway, path, body, model):
    response = _post(gateway, path, {"model": model, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_task" and error["param"] == "model"
    assert model in error["message"] and path in error["message"]


def test_a_refused_task_charges_no_tokens(gateway):
    before = _post(gateway, "/v1/embeddings", {"model": "everything", "input": "hi"})
    _post(gateway, "/v1/embeddings", {"model": "chat-only", "input": "x" * 5000})
    after = _post(gateway, "/v1/embeddings", {"model": "everything", "input": "hi"})
    used = before.json()["usage"]["total_tokens"]
    assert (int(before.headers["x-ratelimit-remaining-tokens"]) - int(after.headers["x-ratelimit-remaining-tokens"])
            == used)


def test_a_mixed_route_sends_each_task_to_the_backends_that_serve_it(gateway):
    ids = []
    for i in range(6):
        ids.append(f"emb-{i}")
        assert _post(gateway, "/v1/embeddings", {"model": "mixed", "input": "hi"}, request_id=ids[-1]).status_code == 200
        ids.append(f"rr-{i}")
        assert _post(gateway, "/v1/rerank", {"model": "mixed", **RERANK}, request_id=ids[-1]).status_code == 200
    ids.append("chat-0")
    chat = _post(gateway, "/v1/chat/completions", {"model": "mixed", "messages": CHAT, "max_tokens": 2},
                 request_id=ids[-1])
    assert chat.status_code == 200
    lines = gateway.access_lines(*ids)
    assert {lines[i]["backend"] for i in ids if not i.startswith("chat")} == {"tiny-embed"}
    assert lines["chat-0"]["backend"] == "tiny-chat"


def test_a_fallback_that_serves_the_task_takes_it(gateway):
    response = _post(gateway, "/v1/embeddings", {"model": "chat-then-embed", "input": "hi"}, request_id="fb-1")
    assert response.status_code == 200, response.text
    line = gateway.access_lines("fb-1")["fb-1"]
    assert line["route"] == "embed-only" and line["backend"] == "tiny-embed"


def test_the_allow_list_comes_before_the_task(gateway):
    response = _post(gateway, "/v1/embeddings", {"model": "everything", "input": "hi"}, key=BOB)
    assert response.status_code == 403 and response.json()["error"]["code"] == "model_not_allowed"
    # Bob may use chat-only, whose fallback-free route serves no embeddings: a task error, not a way around it.
    refused = _post(gateway, "/v1/embeddings", {"model": "chat-only", "input": "hi"}, key=BOB)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "unsupported_task"


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/rerank"])
def test_tokens_are_settled_with_the_real_usage(gateway, path):
    body = {"model": "everything", "input": "a red apple " * 20} if path == "/v1/embeddings" else \
        {"model": "everything", **RERANK}
    first = _post(gateway, path, body)
    second = _post(gateway, path, body)
    real = second.json()["usage"]["total_tokens"]
    # Each response reports what remains after its own reservation (the same estimate for both); between them the
    # first was settled, its estimate replaced by its real usage.
    drop = int(first.headers["x-ratelimit-remaining-tokens"]) - int(second.headers["x-ratelimit-remaining-tokens"])
    assert drop == real > 0


@pytest.mark.parametrize("body, param", [
    ({"query": "q"}, "documents"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": "one"}, "documents"),
    ({"query": "q", "documents": ["a", 2]}, "documents"),
    ({"query": None, "documents": ["a"]}, "query"),
    ({"documents": ["a"]}, "query"),
    ({"query": "q", "documents": ["ok", "x" * 600_000]}, "documents"),  # more than the context, whatever the tokenizer
])
def test_bad_rerank_bodies_are_refused_at_the_gateway(gateway, body, param):
    response = _post(gateway, "/v1/rerank", {"model": "everything", **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
