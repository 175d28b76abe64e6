"""The runtime credential (--api-key-file): only its holder gets past /health, /ready, /metrics and /load."""
import subprocess
import time

import httpx
import openai
import pytest

from fixtures.runtime_server import _command, start_runtime_server

pytestmark = pytest.mark.integration

CREDENTIAL = "rt-credential-7f3a9c"
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
GRACE_S = 5  # how long the runtime under test still accepts a replaced credential


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("credential") / "api-key"
    path.write_text(CREDENTIAL + "\n")  # as a mounted Secret may hold it
    return path


@pytest.fixture(scope="module")
def guarded(key_file):
    with start_runtime_server("--api-key-file", str(key_file), "--api-key-grace-s", str(GRACE_S)) as server:
        yield server


def refused(response: httpx.Response) -> dict:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_api_key"
    return error


def test_the_credential_holder_is_served_through_the_openai_client(guarded):
    with openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=CREDENTIAL, max_retries=0) as client:
        reply = client.chat.completions.create(**CHAT)
        assert reply.choices[0].finish_reason == "length"
        assert [m.id for m in client.models.list().data] == ["smollm2"]


def test_a_wrong_key_is_refused_through_the_openai_client(guarded):
    with openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="sk-sluice-demo", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as info:
            client.chat.completions.create(**CHAT)
    assert info.value.body["code"] == "invalid_api_key"


@pytest.mark.parametrize("headers", [
    [],
    [("authorization", f"bearer {CREDENTIAL}")],  # the exact header the gateway sends, nothing looser
    [("authorization", f"BEARER {CREDENTIAL}")],
    [("authorization", f"Bearer  {CREDENTIAL}")],
    [("authorization", f"Bearer\t{CREDENTIAL}")],
    [("authorization", f"Bearer {CREDENTIAL}x")],
    [("authorization", f"Bearer {CREDENTIAL[:-1]}")],
    [("authorization", CREDENTIAL)],
    [("authorization", f"Basic {CREDENTIAL}")],
    [("authorization", "Bearer")],
    [("authorization", f"Bearer {CREDENTIAL}"), ("authorization", "Bearer wrong")],
    [("authorization", "Bearer wrong"), ("authorization", f"Bearer {CREDENTIAL}")],
    [("authorization", f"Bearer {CREDENTIAL}"), ("authorization", f"Bearer {CREDENTIAL}")],
    [("x-api-key", CREDENTIAL)],
])
def test_anything_but_the_exact_header_is_refused(guarded, headers):
    response = httpx.post(f"{guarded.url}/v1/chat/completions", json=CHAT, headers=headers)
    refused(response)
    assert response.headers["x-request-id"]


@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/models"), ("GET", "/v1/models/smollm2"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings"),
    ("POST", "/v1/rerank"), ("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"), ("GET", "/docs"), ("GET", "/openapi.json"),
    ("GET", "/v1/nothing"), ("GET", "//v1/models"), ("GET", "/health/"), ("GET", "/load/../v1/models"),
])
def test_every_other_path_needs_the_credential(guarded, method, path):
    refused(httpx.request(method, f"{guarded.url}{path}", json={"model": "smollm2", "prompt": "hi"}))


def test_probes_and_the_scraper_paths_stay_open(guarded):
    assert httpx.get(f"{guarded.url}/health").status_code == 200
    assert httpx.get(f"{guarded.url}/ready").json() == {"ready": True}
    assert "vllm:num_requests_running" in httpx.get(f"{guarded.url}/metrics").text
    assert httpx.get(f"{guarded.url}/load").json()["running"] == 0


def test_refusals_are_logged(guarded):
    httpx.get(f"{guarded.url}/v1/models", headers={"x-request-id": "no-key-1"})
    httpx.get(f"{guarded.url}/health")  # a request after it: the first one's log line is written by then
    line = next(r for r in reversed(guarded.request_log()) if r.get("client_request_id") == "no-key-1")
    assert line["status"] == 401 and line["error_code"] == "invalid_api_key"


def models_with(server, credential: str) -> httpx.Response:
    return httpx.get(f"{server.url}/v1/models", headers={"authorization": f"Bearer {credential}"})


def test_a_rotated_credential_takes_effect_without_a_restart_and_the_old_one_ends_after_the_grace(guarded, key_file):
    key_file.write_text("rt-credential-rotated\n")
    try:
        assert models_with(guarded, "rt-credential-rotated").status_code == 200
        # The gateway's copy of the Secret may not have been updated yet: the replaced credential still works...
        assert models_with(guarded, CREDENTIAL).status_code == 200
        seen_at = time.monotonic()
        refused(models_with(guarded, "rt-credential-older"))  # ...and nothing else does
        time.sleep(max(0.0, seen_at + GRACE_S + 0.5 - time.monotonic()))
        refused(models_with(guarded, CREDENTIAL))  # ...until the grace has passed
        assert models_with(guarded, "rt-credential-rotated").status_code == 200
    finally:
        key_file.write_text(CREDENTIAL + "\n")
    assert models_with(guarded, CREDENTIAL).status_code == 200


def test_a_bad_rotated_file_keeps_the_current_credential_and_says_why(guarded, key_file):
    for bad in ("", "two words\n", "x" * 5000):
        key_file.write_text(bad)
        try:
            assert models_with(guarded, CREDENTIAL).status_code == 200
            refused(models_with(guarded, "two"))
        finally:
            key_file.write_text(CREDENTIAL + "\n")
    assert "keeping the runtime credential in force" in guarded.stderr()
    assert models_with(guarded, CREDENTIAL).status_code == 200


@pytest.mark.parametrize("grace, message", [
    ("-1", "api key grace must be in [0, 86400] s, got -1.0"),
    ("nan", "api key grace must be in [0, 86400] s, got nan"),
    ("inf", "api key grace must be in [0, 86400] s, got inf"),
    ("86401", "api key grace must be in [0, 86400] s"),
    ("five", "argument --api-key-grace-s: invalid float value: 'five'"),
])
def test_a_bad_grace_refuses_to_start(tmp_path, grace, message):
    path = tmp_path / "api-key"
    path.write_text(CREDENTIAL)
    done = subprocess.run(_command() + ["serve", "--api-key-file", str(path), "--api-key-grace-s", grace],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("content, message", [
    (None, "cannot read the api key file"),
    ("", "is empty"),
    (" \n\t\n", "is empty"),
    ("two words", "printable ASCII without spaces"),
])
def test_a_bad_key_file_refuses_to_start(tmp_path, content, message):
    path = tmp_path / "api-key"
    if content is not None:
        path.write_text(content)
    done = subprocess.run(_command() + ["serve", "--api-key-file", str(path), "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert message in done.stderr and str(path) in done.stderr
    assert "Traceback" not in done.stderr


def test_a_directory_as_key_file_refuses_to_start(tmp_path):
    done = subprocess.run(_command() + ["serve", "--api-key-file", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cannot read the api key file" in done.stderr
