"""Explicit nulls and logit_bias as other client libraries send them, against the runtime directly."""
import pytest

from fixtures.clients import run_client

pytestmark = pytest.mark.integration


def test_openai_2x_sends_null_for_every_optional_parameter(runtime_server):
    result = run_client("""
        import json, os
        from openai import OpenAI

        client = OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"])
        nulls = {name: None for name in ("frequency_penalty", "presence_penalty", "logprobs", "top_logprobs", "n",
                                         "seed", "stop", "temperature", "top_p", "user", "logit_bias", "tools",
                                         "tool_choice", "response_format", "stream_options", "parallel_tool_calls",
                                         "service_tier", "metadata", "store", "max_completion_tokens")}
        chat = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi."}],
                                              max_tokens=3, stream=None, **nulls)
        legacy = client.completions.create(
            model="smollm2", prompt="Once upon a time", max_tokens=3, echo=None, presence_penalty=None,
            frequency_penalty=None, stream=None, logprobs=None, best_of=None, logit_bias=None, seed=None, stop=None,
            suffix=None, temperature=None, top_p=None, user=None, n=None)
        print(json.dumps({"chat": chat.choices[0].finish_reason, "legacy": legacy.choices[0].finish_reason}))
    """, base_url=f"{runtime_server}/v1")
    assert result["chat"] in ("stop", "length") and result["legacy"] in ("stop", "length")


def test_langchain_and_llama_index_send_a_logit_bias_that_forces_a_token(runtime_server, smollm2_dir):
    from transformers import AutoTokenizer

    (banana,) = AutoTokenizer.from_pretrained(smollm2_dir).encode(" banana")
    result = run_client(f"""
        import json, os
        from langchain_openai import ChatOpenAI
        from llama_index.llms.openai_like import OpenAILike
        from llama_index.core.llms import ChatMessage

        bias = {{"{banana}": 100}}
        langchain = ChatOpenAI(model="smollm2", base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"],
                               temperature=0, max_tokens=3, logit_bias=bias).invoke("Name a fruit.").content
        llama = OpenAILike(model="smollm2", api_base=os.environ["BASE_URL"], api_key=os.environ["API_KEY"],
                           is_chat_model=True, temperature=0, max_tokens=3,
                           additional_kwargs={{"logit_bias": bias}})
        llama_index = llama.chat([ChatMessage(role="user", content="Name a fruit.")]).message.content
        print(json.dumps({{"langchain": langchain, "llama_index": llama_index}}))
    """, base_url=f"{runtime_server}/v1")
    assert result == {"langchain": " banana" * 3, "llama_index": " banana" * 3}
