"""GPU check of the executor: correctness against the CPU reference, then decode speed. One script, minutes.

1. SmolLM2 greedy outputs on the GPU (float32: the Triton kernels, CUDA graphs, device sampling)
   against the CPU engine, token for token; bfloat16 agreement is reported for information.
2. A random-weight model with Llama-3.2-1B's shape in bfloat16: batch-1 decode tokens/s and its
   share of the HBM bound (weight bytes read per step / --hbm-tb-s, 4.8 TB/s for an H200), and
   output tokens/s at batch 64 and 256 with 512-token prompts (prefill included).
3. The same with CUDA graphs off (--enforce-eager), to show what they buy.
Targets: batch-1 decode at 50% or more of the bound with graphs; batch 256 at least 20x batch 1.

Prints a table and writes bench/results/gpu_check.json. Without CUDA it says so and exits 1.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from sluice_runtime.engine.llm_engine import LLMEngine
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.sampling_params import SamplingParams

RESULTS = Path(__file__).parent / "results"

LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "tie_word_embeddings": True, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "def fib(n):",
             "Explain photosynthesis to a child in three sentences."]


def make_random_model_dir(target: Path, shape: dict, dtype: torch.dtype, device: str, tokenizer_dir: Path) -> int:
    """An HF-format directory with random weights of `shape` (std 0.02, norms at 1) and the tokenizer of
    tokenizer_dir; returns the bytes of weights one decode step reads (the tied embedding once, as the LM head)."""
    from safetensors.torch import save_file

    target.mkdir(parents=True, exist_ok=True)
    hidden, inter, vocab = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    dim = shape.get("head_dim") or hidden // shape["num_attention_heads"]
    q, kv = shape["num_attention_heads"] * dim, shape["num_key_value_heads"] * dim
    generator = torch.Generator(device).manual_seed(0)

    def weight(*size):
        return (torch.randn(*size, generator=generator, device=device) * 0.02).to(dtype).cpu()

    tensors = {"model.embed_tokens.weight": weight(vocab, hidden), "model.norm.weight": torch.ones(hidden, dtype=dtype)}
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {p + "input_layernorm.weight": torch.ones(hidden, dtype=dtype),
                    p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=dtype),
                    p + "self_attn.q_proj.weight": weight(q, hidden), p + "self_attn.k_proj.weight": weight(kv, hidden),
                    p + "self_attn.v_proj.weight": weight(kv, hidden), p + "self_attn.o_proj.weight": weight(hidden, q),
                    p + "mlp.gate_proj.weight": weight(inter, hidden), p + "mlp.up_proj.weight": weight(inter, hidden),
                    p + "mlp.down_proj.weight": weight(hidden, inter)}
    if not shape.get("tie_word_embeddings"):
        tensors["lm_head.weight"] = weight(vocab, hidden)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(shape | {"torch_dtype": str(dtype).removeprefix("torch.")}))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, target / name)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def measure(engine: LLMEngine, batch: int, prompt_len: int, output_len: int, seed: int = 0) -> dict:
    """`batch` random prompts submitted at once; wall time to the last token (prefill included)."""
    rng = random.Random(seed)
    vocab = engine.runner.cfg.vocab_size
    params = SamplingParams(max_tokens=output_len, min_tokens=output_len, ignore_eos=True, temperature=0)
    start = time.perf_counter()
    for i in range(batch):
        engine.add_request(f"gpu-check-{seed}-{batch}-{i}", [rng.randrange(100, vocab) for _ in range(prompt_len)],
                           params)
    itls, tokens = [], 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                n = len(out.outputs[0].token_ids)
                tokens += n
                itls.append((out.metrics.last_token_time - out.metrics.first_token_time) / max(n - 1, 1))
    seconds = time.perf_counter() - start
    itl = sum(itls) / len(itls)
    return {"batch": batch, "prompt_len": prompt_len, "output_len": output_len, "seconds": seconds,
            "output_tok_s": tokens / seconds, "itl_ms": itl * 1e3, "decode_tok_s": batch / itl}


def format_table(rows: list[dict]) -> str:
    header = (f"{'run':28} {'batch':>5} {'prompt':>6} {'out':>4} {'out tok/s':>10} {'ITL ms':>7} "
              f"{'decode tok/s':>12} {'HBM bound':>9} {'x batch 1':>9}")
    lines = [header, "-" * len(header)]
    for r in rows:
        bound = f"{r['hbm_fraction']:.0%}" if "hbm_fraction" in r else ""
        ratio = f"{r['x_batch1']:.1f}" if "x_batch1" in r else ""
        lines.append(f"{r['run']:28} {r['batch']:>5} {r['prompt_len']:>6} {r['output_len']:>4} {r['output_tok_s']:>10.0f} "
                     f"{r['itl_ms']:>7.2f} {r['decode_tok_s']:>12.0f} {bound:>9} {ratio:>9}")
    return "\n".join(lines)


def _release(engine: LLMEngine) -> None:
    engine.runner.close()
    del engine
    gc.collect()
    torch.cuda.empty_cache()


def check_greedy(output_len: int) -> dict:
    """SmolLM2 greedy on the CPU engine, then on the GPU in float32 (must match) and bfloat16 (reported)."""
    def run(**engine_args) -> tuple[list[list[int]], str]:
        engine = LLMEngine(EngineConfig(model="smollm2", kv_cache_memory=1 << 30, **engine_args))
        prompts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                        tokenize=True, return_dict=False) for q in QUESTIONS]
        params = SamplingParams(max_tokens=output_len, min_tokens=output_len, temperature=0)
        for i, p in enumerate(prompts):
            engine.add_request(f"greedy-{i}", p, params)
        outputs: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = out.outputs[0].token_ids
        backend = engine.runner.backend.name
        if engine.runner.device.type == "cuda":
            _release(engine)
        return [outputs[f"greedy-{i}"] for i in range(len(prompts))], backend

    cpu, _ = run(device="cpu", dtype="float32")
    gpu32, backend32 = run(device="cuda", dtype="float32")
    gpu16, backend16 = run(device="cuda", dtype="bfloat16")
    agree16 = sum(a == b for x, y in zip(cpu, gpu16) for a, b in zip(x, y)) / sum(len(x) for x in cpu)
    return {"float32_matches_cpu": gpu32 == cpu, "float32_backend": backend32, "bfloat16_backend": backend16,
            "bfloat16_token_agreement": agree16, "cpu": cpu, "gpu_float32": gpu32}


def speed(model_dir: Path, weight_bytes: int, hbm_bytes_s: float, enforce_eager: bool, args) -> list[dict]:
    engine = LLMEngine(EngineConfig(
        model=str(model_dir), dtype="bfloat16", device="cuda", enforce_eager=enforce_eager,
        gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=max(args.batches),
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.prompt_len + args.output_len + 16))
    label = "eager" if enforce_eager else f"CUDA graphs ({engine.runner.backend.name})"
    measure(engine, 2, 32, 8, seed=99)  # warm-up: kernels compile, allocator settles
    rows = []
    single = measure(engine, 1, args.single_prompt_len, args.single_output_len)
    single |= {"run": f"1B bf16, {label}", "hbm_fraction": weight_bytes / hbm_bytes_s / (single["itl_ms"] / 1e3)}
    rows.append(single)
    for batch in args.batches:
        row = measure(engine, batch, args.prompt_len, args.output_len, seed=batch)
        row |= {"run": f"1B bf16, {label}", "x_batch1": row["output_tok_s"] / single["decode_tok_s"]}
        rows.append(row)
        print(format_table([row]).splitlines()[-1], flush=True)
    _release(engine)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hbm-tb-s", type=float, default=4.8, help="HBM bandwidth of the device (H200: 4.8)")
    parser.add_argument("--greedy-tokens", type=int, default=24)
    parser.add_argument("--single-prompt-len", type=int, default=128)
    parser.add_argument("--single-output-len", type=int, default=256)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    # Two engines of the 1B model live one after the other; each leaves room for the other's remains.
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.45)
    parser.add_argument("--json", type=Path, default=RESULTS / "gpu_check.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: needs a CUDA device, and torch sees none (torch.cuda.is_available() is False); "
              "run it on a GPU machine", file=sys.stderr)
        return 1

    started = time.perf_counter()
    device = torch.cuda.get_device_name()
    print(f"{device}; torch {torch.__version__}", flush=True)
    greedy = check_greedy(args.greedy_tokens)
    print(f"SmolLM2 greedy, {len(QUESTIONS)} prompts x {args.greedy_tokens} tokens: float32 on GPU "
          f"({greedy['float32_backend']}) {'matches' if greedy['float32_matches_cpu'] else 'DIFFERS FROM'} the CPU "
          f"reference; bfloat16 ({greedy['bfloat16_backend']}) agrees on {greedy['bfloat16_token_agreement']:.0%} "
          "of tokens", flush=True)

    from sluice_runtime.models.loading import resolve_model

    with tempfile.TemporaryDirectory(prefix="sluice-1b-") as tmp:
        weight_bytes = make_random_model_dir(Path(tmp), LLAMA_3_2_1B, torch.bfloat16, "cuda", resolve_model("smollm2"))
        hbm = args.hbm_tb_s * 1e12
        print(f"Llama-3.2-1B shape, random bf16 weights: {weight_bytes / 1e9:.2f} GB read per decode step; "
              f"HBM bound {hbm / weight_bytes:.0f} tok/s at batch 1", flush=True)
        rows = speed(Path(tmp), weight_bytes, hbm, False, args) + speed(Path(tmp), weight_bytes, hbm, True, args)

    print()
    print(format_table(rows))
    graphs, eager = rows[0], rows[len(rows) // 2]
    print(f"\nbatch-1 decode: {graphs['decode_tok_s']:.0f} tok/s with CUDA graphs ({graphs['hbm_fraction']:.0%} of the "
          f"HBM bound; target 50%), {eager['decode_tok_s']:.0f} eager ({graphs['decode_tok_s'] / eager['decode_tok_s']:.1f}x)")
    largest = rows[len(rows) // 2 - 1]
    print(f"batch {largest['batch']}: {largest['x_batch1']:.1f}x batch 1 (target 20x); took "
          f"{time.perf_counter() - started:.0f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"device": device, "torch": torch.__version__, "greedy": greedy,
                                     "weight_bytes_per_step": weight_bytes, "hbm_tb_s": args.hbm_tb_s, "rows": rows},
                                    indent=2))
    return 0 if greedy["float32_matches_cpu"] else 2


if __name__ == "__main__":
    sys.exit(main())
