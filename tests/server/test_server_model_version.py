"""The runtime called directly names the version it serves: in a header, as system_fingerprint in bodies and
every stream chunk, and with its tokenizer's and chat template's versions in its start-up line."""
import re

import pytest

from sluice_contracts.model_version import fingerprint
from sluice_runtime.server.settings import ServerSettings

pytestmark = pytest.mark.integration

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def test_answers_name_the_served_version_and_the_start_names_its_tokenizer_and_template(runtime_server_process,
                                                                                       runtime_openai):
    # The session's runtime is given no --model-version: its --model stands in.
    whole = runtime_openai.chat.completions.with_raw_response.create(**CHAT)
    chunks = list(runtime_openai.chat.completions.create(**CHAT, stream=True, stream_options={"include_usage": True}))
    legacy = runtime_openai.completions.create(model="smollm2", prompt="Hi", max_tokens=2)
    assert whole.headers["x-sluice-model-version"] == "smollm2"
    assert {whole.parse().system_fingerprint, legacy.system_fingerprint} == {fingerprint("smollm2")}
    assert {c.system_fingerprint for c in chunks} == {fingerprint("smollm2")}
    started = runtime_server_process.stderr()
    assert re.search(r"model version smollm2 \(system_fingerprint fp_[0-9a-f]{12}\); tokenizer version "
                     r"[0-9a-f]{12}; chat template version [0-9a-f]{12}", started), started[-2000:]


@pytest.mark.parametrize("version", ["two words", "", "é"])
def test_a_version_no_header_can_hold_is_refused_at_start(version):
    with pytest.raises(ValueError, match="printable ASCII"):
        ServerSettings(model_version=version)
