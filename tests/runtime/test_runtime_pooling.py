"""--pooling last: the last token's final hidden state, equal to transformers' on the same model, one prompt at a
time and packed into shared forwards; a pooling the engine does not know is refused at start."""
import pytest
import torch

from sluice_runtime.engine.llm import LLM
from sluice_runtime.engine_config import EngineConfig

TEXTS = ["A cat sleeps on the sofa.", "hi", "Quarterly tax filing deadlines fall in April. " * 30,
         "def add(a, b):\n    return a + b\n"]


def test_last_token_pooling_matches_transformers(smollm2_dir):
    from transformers import AutoModel

    # A small step budget, so the batch is packed into several forwards.
    llm = LLM("smollm2", pooling="last", num_kv_blocks=16, max_num_batched_tokens=256)
    model = AutoModel.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    ids = [llm.tokenizer.encode(t) for t in TEXTS]
    references = []
    for prompt in ids:
        with torch.no_grad():
            hidden = model(torch.tensor([prompt])).last_hidden_state[0]
        references.append(torch.nn.functional.normalize(hidden[-1], dim=0))
    assert len(llm.engine.embedding_batches(ids * 2)) > 1
    batched = llm.embed(ids * 2)
    single = [llm.embed([prompt])[0] for prompt in ids]
    for vector, reference in zip(batched + single, references * 3):
        assert float(torch.tensor(vector) @ reference) >= 0.999
    assert llm.engine.block_manager.usage == 0, "embeddings hold no KV blocks"


@pytest.mark.parametrize("pooling", ["max", "", "LAST", None])
def test_an_unknown_pooling_is_refused(pooling):
    with pytest.raises(ValueError, match="pooling must be one of mean, last"):
        EngineConfig(pooling=pooling)
