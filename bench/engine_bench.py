"""Engine throughput on this CPU versus transformers, all measured in one run.

64 requests, prompt lengths uniform in [32, 512], 128 output tokens each (ignore_eos), SmolLM2
in bfloat16 (--dtype). Rows: Sluice's engine at concurrency 1, 8, 32, 64 (a client keeps that many requests in
flight); transformers `generate` one request at a time; transformers' continuous batching
(`generate_batch`). Sequential rows run a prefix of the requests to stay bounded; tokens/s is
comparable across rows. Writes bench/results/engine.json and engine.png.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from sluice_runtime.engine.config import EngineConfig
from sluice_runtime.engine.llm_engine import LLMEngine
from sluice_runtime.engine.sampling_params import SamplingParams

RESULTS = Path(__file__).parent / "results"


def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def matmul_gflops(dtype=torch.float32, size=1024, seconds=2.0) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    for _ in range(3):
        a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    return 2 * size**3 * n / (time.perf_counter() - start) / 1e9


def run_engine(engine: LLMEngine, prompts, output_len: int, concurrency: int) -> dict:
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0)
    pending = list(enumerate(prompts))
    submitted: dict[str, float] = {}
    ttfts, itls, tokens = [], [], 0
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and len(submitted) < concurrency:
            i, prompt = pending.pop(0)
            engine.add_request(f"bench-{concurrency}-{i}", prompt, params)
            submitted[f"bench-{concurrency}-{i}"] = time.time()
        for out in engine.step():
            if out.finished:
                m = out.metrics
                n = len(out.outputs[0].token_ids)
                tokens += n
                ttfts.append(m.first_token_time - submitted.pop(out.request_id))
                if n > 1:
                    itls.append((m.last_token_time - m.first_token_time) / (n - 1))
    elapsed = time.perf_counter() - start
    return {"requests": len(prompts), "output_tokens": tokens, "seconds": elapsed,
            "output_tok_s": tokens / elapsed, "mean_ttft_s": sum(ttfts) / len(ttfts),
            "mean_itl_s": sum(itls) / len(itls)}


def run_hf_sequential(model, prompts, output_len: int) -> dict:
    tokens, ttfts, itls = 0, [], []
    start = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            ttft = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False)
            total = time.perf_counter() - t0
            n = out.shape[1] - len(prompt)
            tokens += n
            ttfts.append(ttft)
            itls.append((total - ttft) / max(n - 1, 1))
    # TTFT probes are extra work; the throughput counts only the full generations.
    elapsed = time.perf_counter() - start - sum(ttfts)
    return {"requests": len(prompts), "output_tokens": tokens, "seconds": elapsed, "output_tok_s": tokens / elapsed,
            "mean_ttft_s": sum(ttfts) / len(ttfts), "mean_itl_s": sum(itls) / len(itls)}


def run_hf_generate_batch(model, prompts, output_len: int) -> dict:
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
                              eos_token_id=model.generation_config.eos_token_id, pad_token_id=0)
    start = time.perf_counter()
    with torch.inference_mode():
        outputs = model.generate_batch(inputs=prompts, generation_config=config, record_timestamps=True)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.generated_tokens) for o in outputs.values())
    ttfts, itls = [], []
    for o in outputs.values():
        stamps = getattr(o, "timestamps", None) or []
        created = getattr(o, "created_time", None)
        if stamps and created:
            ttfts.append(stamps[0] - created)
            if len(stamps) > 1:
                itls.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    return {"requests": len(prompts), "output_tokens": tokens, "seconds": elapsed, "output_tok_s": tokens / elapsed,
            "mean_ttft_s": sum(ttfts) / len(ttfts) if ttfts else float("nan"),
            "mean_itl_s": sum(itls) / len(itls) if itls else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--sequential-requests", type=int, default=6,
                        help="requests for the one-at-a-time rows (concurrency 1 and transformers generate)")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--min-prompt", type=int, default=32)
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--dtype", default="bfloat16", help="weights and KV cache, for every row alike")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    engine = LLMEngine(EngineConfig(model="smollm2", dtype=args.dtype, max_num_seqs=64,
                                    max_num_batched_tokens=1024, kv_cache_memory=2 << 30))
    prompts = make_prompts(args.requests, args.min_prompt, args.max_prompt, engine.runner.cfg.vocab_size, args.seed)
    params_total = engine.runner.num_parameters
    embedding = engine.runner.model.embed_tokens.weight.numel()
    gflops = matmul_gflops(getattr(torch, args.dtype))
    # FLOPs of the whole mix (DESIGN.md, Benchmarks): prompt tokens skip the LM head, generated ones do not.
    prompt_tokens = sum(len(p) for p in prompts)
    output_tokens = args.requests * args.output_len
    mix_flops = 2 * (params_total - embedding) * prompt_tokens + 2 * params_total * output_tokens
    roofline_tok_s = gflops * 1e9 / mix_flops * output_tokens
    decode_only_limit = gflops * 1e9 / (2 * params_total)

    rows: dict[str, dict] = {}
    run_engine(engine, prompts[:2], 8, 2)  # warm-up
    for c in args.concurrency:
        subset = prompts[: args.sequential_requests] if c == 1 else prompts
        rows[f"sluice c={c}"] = run_engine(engine, subset, args.output_len, c)
        print(f"sluice c={c}: {rows[f'sluice c={c}']['output_tok_s']:.1f} tok/s", flush=True)
    del engine
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        from sluice_runtime.models.loading import resolve_model

        model = AutoModelForCausalLM.from_pretrained(str(resolve_model("smollm2")), dtype=getattr(torch, args.dtype))
        model.eval()
        rows["transformers generate (sequential)"] = run_hf_sequential(
            model, prompts[: args.sequential_requests], args.output_len)
        print(f"hf sequential: {rows['transformers generate (sequential)']['output_tok_s']:.1f} tok/s", flush=True)
        try:
            rows["transformers generate_batch"] = run_hf_generate_batch(model, prompts, args.output_len)
        except Exception as exc:  # report instead of losing the other rows
            rows["transformers generate_batch"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"hf generate_batch: {rows['transformers generate_batch']}", flush=True)

    print(f"\nmatmul {args.dtype}: {gflops:.1f} GFLOP/s; mix roofline {roofline_tok_s:.1f} output tok/s "
          f"(decode-only limit {decode_only_limit:.1f}); prompts {prompt_tokens} tokens, outputs {output_tokens}")
    seq = rows.get("transformers generate (sequential)", {}).get("output_tok_s")
    batch = rows.get("transformers generate_batch", {}).get("output_tok_s")
    header = f"{'run':38} {'req':>4} {'tok/s':>8} {'TTFT s':>8} {'ITL ms':>8} {'x seq':>7} {'x batch':>8} {'roofline':>9}"
    print(header)
    print("-" * len(header))
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:38} {r['error']}")
            continue
        tps = r["output_tok_s"]
        print(f"{name:38} {r['requests']:>4} {tps:>8.1f} {r['mean_ttft_s']:>8.2f} {r['mean_itl_s'] * 1000:>8.1f} "
              f"{tps / seq if seq else float('nan'):>7.1f} {tps / batch if batch else float('nan'):>8.1f} "
              f"{tps / roofline_tok_s:>9.1%}")
    RESULTS.mkdir(exist_ok=True)
    summary = {"matmul_gflops": gflops, "roofline_output_tok_s": roofline_tok_s, "dtype": args.dtype,
               "parameters": params_total, "rows": rows, "torch_threads": torch.get_num_threads()}
    (RESULTS / "engine.json").write_text(json.dumps(summary, indent=2))
    _plot(rows, roofline_tok_s)


def _plot(rows: dict, roofline: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, r in rows.items() if "output_tok_s" in r]
    values = [rows[n]["output_tok_s"] for n in names]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh(names, values, color=["#1f77b4" if n.startswith("sluice") else "#999999" for n in names])
    ax.axvline(roofline, color="red", linestyle="--", label=f"matmul roofline {roofline:.0f} tok/s")
    ax.set_xlabel("output tokens/s (SmolLM2-135M, CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "engine.png", dpi=100)


if __name__ == "__main__":
    main()
