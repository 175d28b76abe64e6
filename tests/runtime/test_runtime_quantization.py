"""--quantization int8: a quarter of the weights' memory, perplexity within 2 % of float32's, refused with a
message where it cannot run.

The quality test runs at this CPU's level here and, through test_runtime_cpu_isa's forced runs, at the
AVX2 and generic levels (the weight-only kernel there).
"""
import logging
import math

import pytest
import torch
from torch import nn

from fixtures.model import chat_prompt
from sluice_runtime.engine.llm import LLM
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.executor import int8_linear
from sluice_runtime.sampling_params import SamplingParams

QUESTIONS = [
    "Hi", "What is the capital of France?", "Write a haiku about rain.", "def fib(n):", "List three colors.",
    "Explain gravity to a child.", "What is 12 times 7?", "Give me a tip for sleeping better.",
    "Translate 'good morning' to Spanish.", "Who wrote Hamlet?", "Name a fruit that is yellow.",
    "How do I boil an egg?", "What does a CPU do?", "Tell me a joke.", "Why is the sky blue?",
    "Summarize the plot of Cinderella.",
]
# Not the calibration text: the perplexity is measured on text the smoothing never saw.
TEXT = ("The river rises in the hills to the north of the town and runs south through farmland before it reaches "
        "the sea. In spring the snow melts and the water comes down fast, so the old mill was built on the east "
        "bank where the current is slow. The people of the town have fished the river for centuries, and the "
        "market still sells trout on Saturdays. ") * 3
GREEDY = SamplingParams(max_tokens=16, temperature=0)


def perplexity(llm: LLM, ids: list[int]) -> float:
    runner = llm.engine.runner
    with torch.inference_mode():
        logits = runner.model.logits(runner._embed([ids])[:-1])
    return math.exp(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])).item())


def completions(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def chats(smollm2_tokenizer):
    return [chat_prompt(smollm2_tokenizer, q) for q in QUESTIONS]


def test_int8_keeps_perplexity_within_two_percent_in_a_quarter_of_the_memory(chats, smollm2_tokenizer, caplog,
                                                                             record_property):
    ids = smollm2_tokenizer.encode(TEXT)
    base = LLM("smollm2", max_num_seqs=16)
    base_ppl, base_out, base_bytes = perplexity(base, ids), completions(base, chats), base.engine.runner.weight_bytes
    del base
    with caplog.at_level(logging.INFO, logger="sluice_runtime.executor.model_runner"):
        int8 = LLM("smollm2", max_num_seqs=16, quantization="int8")
    kernel = int8_linear.choose_kernel(torch.device("cpu"), int8.engine.runner.cpu_paths.level)
    assert kernel in caplog.text  # the kernel chosen is in the start log
    int8_ppl, int8_out = perplexity(int8, ids), completions(int8, chats)
    identical = sum(a == b for a, b in zip(base_out, int8_out))
    divergences = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                   for a, b in zip(base_out, int8_out) if a != b]
    figures = {"kernel": kernel, "perplexity_float32": round(base_ppl, 4), "perplexity_int8": round(int8_ppl, 4),
               "identical_completions": f"{identical}/{len(chats)}", "first_divergences": divergences,
               "weight_bytes_ratio": round(int8.engine.runner.weight_bytes / base_bytes, 3)}
    record_property("int8_quality", figures)
    print(figures)
    assert abs(int8_ppl / base_ppl - 1) <= 0.02, figures
    # A quarter, plus the per-channel scales and, with fbgemm, the LM head's packed copy beside the embedding.
    assert int8.engine.runner.weight_bytes <= 0.35 * base_bytes, figures
    answer = int8.generate([chat_prompt(smollm2_tokenizer, "What is the capital of France? Answer in one word.")],
                           SamplingParams(max_tokens=16, temperature=0), use_tqdm=False)[0]
    assert "Paris" in answer.outputs[0].text


def _kernels():
    dynamic_here = "fbgemm" in torch.backends.quantized.supported_engines  # any x86 CPU runs fbgemm's kernel
    return [pytest.param(int8_linear.DYNAMIC, id="dynamic", marks=pytest.mark.skipif(
                not dynamic_here, reason="this torch has no fbgemm (x86 only)")),
            pytest.param(int8_linear.WEIGHT_ONLY, id="weight-only")]


@pytest.mark.parametrize("kernel", _kernels())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_layers_compute_what_the_float_layers_compute(kernel, dtype):
    torch.manual_seed(0)
    embedding = nn.Embedding(50, 64)
    model = nn.ModuleDict({"embed": embedding, "up": nn.Linear(64, 96), "head": nn.Linear(64, 50, bias=False)})
    model["head"].weight = embedding.weight  # tied, as SmolLM2's LM head is
    model = model.to(dtype)
    ids = torch.tensor([3, 7, 49, 0])
    with torch.inference_mode():
        x = model["embed"](ids)
        expected = [x, model["up"](x), model["head"](x)]
        peaks = {"up": x.float().abs().amax(0), "head": x.float().abs().amax(0)}
        int8_linear.quantize_model(model, kernel, peaks)
        actual = [model["embed"](ids), model["up"](x), model["head"](x)]
    for got, want in zip(actual, expected):
        assert got.dtype == dtype and got.shape == want.shape
        # 8 bits keep each output within a few percent of the layer's largest.
        assert (got.float() - want.float()).abs().max() <= 0.03 * want.float().abs().max()


@pytest.mark.parametrize("args,message", [
    ({"quantization": "int4"}, "--quantization must be one of int8, got 'int4'"),
    ({"quantization": "int8", "tensor_parallel_size": 2}, "--quantization is not supported with --tensor-parallel"),
    ({"quantization": "int8", "enable_lora": True}, "--quantization is not supported with --enable-lora"),
])
def test_quantization_the_engine_cannot_run_is_refused_before_loading(args, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**args)


def test_the_cli_refuses_an_unknown_quantization_in_one_line(capsys):
    from sluice_runtime.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--quantization", "fp4"])
    assert exit_info.value.code == 2
    assert "argument --quantization: invalid choice: 'fp4' (choose from 'int8')" in capsys.readouterr().err
