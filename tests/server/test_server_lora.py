"""LoRA adapters over HTTP: chosen by `model`, listed with their parent, loaded and unloaded with vLLM's
endpoints behind the runtime credential, bad adapters refused with OpenAI error JSON, vLLM's adapter metric."""
import json
import shutil

import httpx
import openai
import pytest

from fixtures.lora import MAX_TOKENS, QUESTIONS, build_lora
from fixtures.runtime_server import start_runtime_server

pytestmark = pytest.mark.integration

CREDENTIAL = "rt-credential-lora"
AUTH = {"authorization": f"Bearer {CREDENTIAL}"}


@pytest.fixture(scope="module")
def server(lora_adapters, tmp_path_factory):
    key = tmp_path_factory.mktemp("lora-key") / "api-key"
    key.write_text(CREDENTIAL)
    with start_runtime_server("--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
                              "--lora", f"sql={lora_adapters['sql'].path}", "--api-key-file", str(key)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=CREDENTIAL, max_retries=0, timeout=120) as c:
        yield c


def _chat(client, model: str, question: str) -> str:
    response = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                              max_tokens=MAX_TOKENS, temperature=0, extra_body={"min_tokens": MAX_TOKENS})
    return response.choices[0].message.content


def _expected(tokenizer, tokens: list[int]) -> str:
    return tokenizer.decode(tokens, skip_special_tokens=True)


def _load(server, body, headers=AUTH) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/load_lora_adapter", json=body, headers=headers, timeout=60)


def _unload(server, body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/unload_lora_adapter", json=body, headers=AUTH, timeout=60)


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_adapters_are_listed_with_their_parent(server, client, lora_adapters):
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {"smollm2", "sql"}
    assert cards["sql"].parent == "smollm2" and cards["sql"].root == str(lora_adapters["sql"].path)
    assert getattr(cards["smollm2"], "parent", None) is None
    assert client.models.retrieve("sql").parent == "smollm2"


def test_a_request_naming_an_adapter_gets_the_peft_merged_answer(client, lora_adapters, base_reference,
                                                                 smollm2_tokenizer):
    assert _chat(client, "sql", QUESTIONS[1]) == _expected(smollm2_tokenizer, lora_adapters["sql"].reference[1])
    assert _chat(client, "smollm2", QUESTIONS[1]) == _expected(smollm2_tokenizer, base_reference[1])


def test_an_adapter_loaded_at_run_time_serves_until_unloaded(server, client, lora_adapters, smollm2_tokenizer):
    response = _load(server, {"lora_name": "tone", "lora_path": str(lora_adapters["tone"].path)})
    assert response.status_code == 200 and response.text == "Success: LoRA adapter 'tone' added successfully."
    assert "tone" in {m.id for m in client.models.list().data}
    assert _chat(client, "tone", QUESTIONS[0]) == _expected(smollm2_tokenizer, lora_adapters["tone"].reference[0])
    again = _error(_load(server, {"lora_name": "tone", "lora_path": str(lora_adapters["tone"].path)}), 400)
    assert again["message"] == "The lora adapter 'tone' has already been loaded."
    response = _unload(server, {"lora_name": "tone"})
    assert response.status_code == 200 and response.text == "Success: LoRA adapter 'tone' removed successfully."
    with pytest.raises(openai.NotFoundError) as gone:
        _chat(client, "tone", QUESTIONS[0])
    assert gone.value.body["code"] == "model_not_found"
    assert _error(_unload(server, {"lora_name": "tone"}), 404)["message"] == "The lora adapter 'tone' cannot be found."


def test_adapters_beyond_max_loras_take_turns_and_each_answers_as_its_own(server, client, lora_adapters,
                                                                         smollm2_tokenizer):
    for name in ("tone", "mlp"):
        assert _load(server, {"lora_name": name, "lora_path": str(lora_adapters[name].path)}).status_code == 200
    try:
        for name in ("sql", "tone", "mlp", "sql"):  # three adapters through two slots
            assert _chat(client, name, QUESTIONS[0]) == _expected(smollm2_tokenizer, lora_adapters[name].reference[0])
        # What the gateway reads for adapter affinity: the two most recently used are resident.
        assert httpx.get(f"{server.url}/load").json()["loaded_adapters"] == ["mlp", "sql"]
    finally:
        for name in ("tone", "mlp"):
            _unload(server, {"lora_name": name})


def _adapter_copy(lora_adapters, tmp_path, change) -> str:
    target = tmp_path / "adapter"
    shutil.copytree(lora_adapters["sql"].path, target)
    change(target)
    return str(target)


def _edit_config(**fields):
    def change(path):
        config = json.loads((path / "adapter_config.json").read_text())
        config.update(fields)
        (path / "adapter_config.json").write_text(json.dumps(config))
    return change


def _poison(path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "adapter_model.safetensors"))
    name = sorted(tensors)[-1]
    tensors[name][0, 0] = float("nan")
    save_file(tensors, str(path / "adapter_model.safetensors"))


@pytest.mark.parametrize("change, message", [
    (lambda p: (p / "adapter_config.json").unlink(), "adapter_config.json is missing"),
    (lambda p: (p / "adapter_model.safetensors").unlink(), "adapter_model.safetensors is missing"),
    (lambda p: (p / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage"),
     "adapter_model.safetensors is corrupt"),
    (lambda p: (p / "adapter_config.json").write_text("{not json"), "adapter_config.json is not valid JSON"),
    (lambda p: (p / "adapter_config.json").write_text("[1, 2]"), "must hold a JSON object"),
    (_edit_config(r=32), "the adapter's rank 32 is above this runtime's --max-lora-rank 16"),
    (_edit_config(r="8"), "r must be a positive integer, got '8'"),
    (_edit_config(r=True), "r must be a positive integer, got True"),
    (_edit_config(r=None), "r must be a positive integer, got None"),
    (_edit_config(lora_alpha=-1), "lora_alpha must be a positive number, got -1"),
    (_edit_config(target_modules=["q_proj", "lm_head"]), "targets lm_head; LoRA is served on q_proj"),
    (_edit_config(target_modules=[]), "target_modules must be a list of module names"),
    (_edit_config(use_dora=True), "sets use_dora (DoRA), which this runtime does not serve"),
    (_edit_config(modules_to_save=["lm_head"]), "sets modules_to_save"),
    (_edit_config(peft_type="PREFIX_TUNING"), "only LORA adapters are served"),
    (_poison, "the LoRA weights hold infinities or NaNs"),
    (_edit_config(r=4), "lora_A is (8, 1536) and lora_B (576, 8), which is not rank 4 as adapter_config.json's r"),
])
def test_a_bad_adapter_is_refused_with_what_is_wrong(server, lora_adapters, tmp_path, change, message):
    error = _error(_load(server, {"lora_name": "bad", "lora_path": _adapter_copy(lora_adapters, tmp_path, change)}),
                   400)
    assert message in error["message"] and error["code"] == "invalid_lora_adapter"
    assert error["param"] == "lora_path"
    assert "bad" not in {m["id"] for m in httpx.get(f"{server.url}/v1/models", headers=AUTH).json()["data"]}


def test_an_adapter_of_another_base_model_is_refused(server, smollm2_dir, tiny_long_context_model_dir, tmp_path):
    build_lora(tiny_long_context_model_dir, tmp_path / "tiny", seed=4, rank=4)
    error = _error(_load(server, {"lora_name": "tiny", "lora_path": str(tmp_path / "tiny")}), 400)
    assert "the adapter was trained for another base model" in error["message"]


@pytest.mark.parametrize("body, param, message", [
    ({"lora_name": "a b", "lora_path": "/x"}, "lora_name", "LoRA adapter name must be"),
    ({"lora_name": "a,b", "lora_path": "/x"}, "lora_name", "LoRA adapter name must be"),
    ({"lora_name": "", "lora_path": "/x"}, "lora_name", "LoRA adapter name must be"),
    ({"lora_name": "x" * 129, "lora_path": "/x"}, "lora_name", "LoRA adapter name must be"),
    ({"lora_name": "smollm2", "lora_path": "/x"}, "lora_name", "is the base model's name"),
    ({"lora_name": 5, "lora_path": "/x"}, "lora_name", None),
    ({"lora_name": "n"}, "lora_path", None),
    ({"lora_name": "n", "lora_path": None}, "lora_path", None),
    ({"lora_name": "n", "lora_path": "/does/not/exist"}, "lora_path", "is not a directory"),
    ({"lora_name": "n", "lora_path": " "}, "lora_path", "LoRA adapter path is empty"),
])
def test_a_bad_load_request_is_refused(server, body, param, message):
    error = _error(_load(server, body), 400)
    assert error["param"] == param
    assert message is None or message in error["message"]


def test_loading_needs_the_runtime_credential(server, lora_adapters):
    response = _load(server, {"lora_name": "tone", "lora_path": str(lora_adapters["tone"].path)}, headers={})
    assert _error(response, 401)["code"] == "invalid_api_key"
    unload = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert _error(unload, 401)["code"] == "invalid_api_key"


def test_the_adapter_metric_has_vllms_shape(server):
    text = httpx.get(f"{server.url}/metrics").text
    line = next(line for line in text.splitlines() if line.startswith("vllm:lora_requests_info{"))
    assert 'max_lora="2"' in line and 'running_lora_adapters=""' in line and 'waiting_lora_adapters=""' in line


def test_a_server_without_lora_refuses_to_load(runtime_server, lora_adapters):
    response = httpx.post(f"{runtime_server}/v1/load_lora_adapter",
                          json={"lora_name": "sql", "lora_path": str(lora_adapters["sql"].path)}, timeout=60)
    assert _error(response, 400)["code"] == "lora_not_enabled"
    assert "vllm:lora_requests_info" not in httpx.get(f"{runtime_server}/metrics").text
    assert httpx.get(f"{runtime_server}/load").json()["loaded_adapters"] is None
