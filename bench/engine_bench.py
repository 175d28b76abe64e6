"""Engine throughput on this CPU versus transformers, and short requests beside long prompts, each measured in one run.

--mix throughput (default): 64 requests, prompt lengths uniform in [32, 512], 128 output tokens
each (ignore_eos), SmolLM2 in --dtype (auto: what the engine picks on this machine). Rows:
Sluice's engine at concurrency 1, 8, 32, 64 (a client keeps that many requests in flight);
transformers `generate` one request at a time; transformers' continuous batching
(`generate_batch`); with --llama-cpp, llama.cpp's server on the GGUF the model comes from at each
concurrency (opt-in, bench/llama_cpp_server.py). Sequential rows run a prefix of the requests to
stay bounded; tokens/s is comparable across rows. --target-itl-ms auto off runs Sluice's rows
once per step budget, alternating, each on fresh tokens of the same lengths (no prefix-cache hits
between rows); --stream marks the requests streamed (read as they come), which the budget
protects; unstreamed, a burst like this one is read whole and the budget leaves it alone. Writes
bench/results/engine.json and engine.png.

--mix short-under-long: 28 short chats (50-200 prompt tokens) and 4 long prompts (2,000 tokens),
64 output tokens each, all sent at once (the long ones first), with the step-time budget on
(--target-itl-ms auto) and off; the short chats alone with each as the baseline. Reports the short
requests' TTFT p50/p99 and ITL p99, the mix's output tokens/s and the idle decode step (median
decode-only step of the short chats alone at their full batch, both budgets' runs), with the
ratios the budget aims at. Writes
bench/results/engine_short_under_long.json.

--mix quantization: the throughput mix's requests at each --concurrency on float32, --quantization int8
and (where the CPU computes it natively) bfloat16 engines, rows alternating so a change in the machine's
load shows on every side; tokens/s per row and int8 / float32 at each concurrency (target >= 1.8),
with the weights' resident bytes of each. The int8 kernel is this CPU level's (SLUICE_CPU_ISA=generic
runs the weight-only one). Writes bench/results/quantization-LEVEL.json.

--mix lora: --requests requests at concurrency 32, each for one of 4 random rank-16 LoRA adapters
(all 7 projections, built with peft) in turn, against the same requests on the base model, in one
engine (--enable-lora --max-loras 4); base, adapters, base again, so a change in the machine's load
shows on both sides. Reports output tokens/s and adapters / base (target >= 0.7). Writes
bench/results/engine_lora.json.

--mix speculative: greedy chats whose answers repeat their prompts (repeat a list, rewrite a paragraph with one
word changed, rename a variable in code) and chats whose answers do not (stories, explanations), each at
--concurrency, without and with --speculative-config (n-gram, K=5, lookup 3..1), rows alternating. Reports
output tokens/s, mean ITL, plain / speculative ITL per row pair and the acceptance rate (accepted / draft
tokens). Run it with --dtype float32: there both sides generate the same tokens, so their rows compare like with
like. Writes bench/results/speculative-LEVEL.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path

import torch

from sluice_runtime.engine.llm_engine import LLMEngine
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.sampling_params import SamplingParams

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


def fresh_tokens(prompts: list[list[int]], vocab: int, tag: str) -> list[list[int]]:
    """Prompts of the same lengths with new tokens: a row repeated gets no prefix-cache hits."""
    rng = random.Random(tag)
    return [[rng.randrange(100, vocab) for _ in prompt] for prompt in prompts]


def run_engine(engine: LLMEngine, prompts, output_len: int, concurrency: int, streamed: bool = False,
               ignore_eos: bool = True) -> dict:
    params = SamplingParams(max_tokens=output_len, ignore_eos=ignore_eos, temperature=0)
    pending = list(enumerate(prompts))
    submitted: dict[str, float] = {}
    ttfts, itls, tokens = [], [], 0
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and len(submitted) < concurrency:
            i, prompt = pending.pop(0)
            request_id = f"bench-{engine.steps}-{concurrency}-{i}"
            engine.add_request(request_id, prompt, params, streamed=streamed)
            submitted[request_id] = time.time()
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
            "mean_itl_s": sum(itls) / len(itls), "load_average": (load_before, os.getloadavg()[0])}


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
    parser.add_argument("--mix", choices=["throughput", "short-under-long", "lora", "quantization", "speculative"],
                        default="throughput")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--sequential-requests", type=int, default=6,
                        help="requests for the one-at-a-time rows (concurrency 1 and transformers generate)")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--min-prompt", type=int, default=32)
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--dtype", default="auto", help="weights and KV cache, for every row alike (auto: the engine's "
                                                        "choice on this machine)")
    parser.add_argument("--target-itl-ms", nargs="+", default=["auto"],
                        help="step budget(s) of Sluice's rows (auto, off or milliseconds); several run alternating")
    parser.add_argument("--stream", action="store_true",
                        help="throughput mix: requests are streamed, so the step budget protects their decodes")
    parser.add_argument("--rounds", type=int, default=1, help="throughput mix: repeats of Sluice's rows")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--llama-cpp", action="store_true",
                        help="throughput and quantization mixes: add llama.cpp's server on the same GGUF at each "
                             "concurrency (opt-in: builds llama-server once, about 13 minutes on 2 cores; "
                             "bench/llama_cpp_server.py)")
    parser.add_argument("--llama-server", metavar="PATH", help="with --llama-cpp: this llama-server, not one built")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's, one per core); 1 steadies figures on a shared machine")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mix == "short-under-long":
        short_under_long(args.dtype, args.seed)
    elif args.mix == "lora":
        lora_mix(args)
    elif args.mix == "quantization":
        quantization_mix(args)
    elif args.mix == "speculative":
        speculative_mix(args)
    else:
        throughput(args)


def throughput(args: argparse.Namespace) -> None:
    engines = {budget: LLMEngine(EngineConfig(model="smollm2", dtype=args.dtype, max_num_seqs=64, target_itl_ms=budget,
                                              max_num_batched_tokens=1024, kv_cache_memory=2 << 30))
               for budget in args.target_itl_ms}
    engine = next(iter(engines.values()))
    dtype = engine.runner.dtype
    prompts = make_prompts(args.requests, args.min_prompt, args.max_prompt, engine.runner.cfg.vocab_size, args.seed)
    params_total = engine.runner.num_parameters
    embedding = engine.runner.model.embed_tokens.weight.numel()
    gflops = matmul_gflops(dtype)
    # FLOPs of the whole mix: prompt tokens skip the LM head, generated ones do not.
    prompt_tokens = sum(len(p) for p in prompts)
    output_tokens = args.requests * args.output_len
    mix_flops = 2 * (params_total - embedding) * prompt_tokens + 2 * params_total * output_tokens
    roofline_tok_s = gflops * 1e9 / mix_flops * output_tokens
    decode_only_limit = gflops * 1e9 / (2 * params_total)

    rows: dict[str, dict] = {}
    # Output tok/s per concurrency: Sluice's rows (each budget and round), llama.cpp's one row.
    sluice_tok_s: dict[int, list[float]] = {}
    llama_cpp_tok_s: dict[int, float] = {}
    vocab = engine.runner.cfg.vocab_size
    for budget, each in engines.items():  # warm-up, and the step budget's first step times
        run_engine(each, fresh_tokens(prompts[:4], vocab, f"warm-{budget}"), 8, 4, args.stream)
    for round_ in range(args.rounds):
        for c in args.concurrency:
            subset = prompts[: args.sequential_requests] if c == 1 else prompts
            for budget, each in engines.items():
                name = f"sluice c={c}" + (f", budget {budget}" if len(engines) > 1 else "") + (
                    f" #{round_ + 1}" if args.rounds > 1 else "")
                tokens = fresh_tokens(subset, vocab, name) if len(engines) > 1 or args.rounds > 1 else subset
                rows[name] = run_engine(each, tokens, args.output_len, c, args.stream)
                sluice_tok_s.setdefault(c, []).append(rows[name]["output_tok_s"])
                print(f"{name}: {rows[name]['output_tok_s']:.1f} tok/s, load {rows[name]['load_average']}", flush=True)
    del engine, engines
    if args.llama_cpp:
        for c in args.concurrency:
            subset = prompts[: args.sequential_requests] if c == 1 else prompts
            if (theirs := llama_cpp_row(args, subset, c, rows)) is not None:
                llama_cpp_tok_s[c] = theirs
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        from sluice_runtime.models.loading import resolve_model

        model = AutoModelForCausalLM.from_pretrained(str(resolve_model("smollm2")), dtype=dtype)
        model.eval()
        rows["transformers generate (sequential)"] = run_hf_sequential(
            model, prompts[: args.sequential_requests], args.output_len)
        print(f"hf sequential: {rows['transformers generate (sequential)']['output_tok_s']:.1f} tok/s", flush=True)
        try:
            rows["transformers generate_batch"] = run_hf_generate_batch(model, prompts, args.output_len)
        except Exception as exc:  # report instead of losing the other rows
            rows["transformers generate_batch"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"hf generate_batch: {rows['transformers generate_batch']}", flush=True)

    print(f"\nmatmul {str(dtype)[6:]}: {gflops:.1f} GFLOP/s; mix roofline {roofline_tok_s:.1f} output tok/s "
          f"(decode-only limit {decode_only_limit:.1f}); prompts {prompt_tokens} tokens, outputs {output_tokens}")
    seq = rows.get("transformers generate (sequential)", {}).get("output_tok_s")
    batch = rows.get("transformers generate_batch", {}).get("output_tok_s")
    for c, theirs in llama_cpp_tok_s.items():
        ours = sluice_tok_s[c]
        print(f"c={c}: Sluice (mean of its rows) / llama.cpp server {sum(ours) / len(ours) / theirs:.2f} "
              "(target >= 1.5)")
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
    summary = {"matmul_gflops": gflops, "roofline_output_tok_s": roofline_tok_s, "dtype": str(dtype)[6:],
               "parameters": params_total, "rows": rows, "torch_threads": torch.get_num_threads(),
               "streamed": args.stream, "target_itl_ms": args.target_itl_ms}
    (RESULTS / "engine.json").write_text(json.dumps(summary, indent=2))
    _plot(rows, roofline_tok_s)


# The short-under-long mix: what a chat service sees when a few long documents arrive with its chats.
SHORT_CHATS, SHORT_PROMPT, LONG_PROMPTS, LONG_PROMPT, MIX_OUTPUT = 28, (50, 200), 4, 2000, 64


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def run_at_once(engine: LLMEngine, prompts: dict[str, list[int]], output_len: int) -> dict:
    """Sends every prompt at once (in the dict's order) and steps until all finish. Returns each
    request's token arrival times, the steps that carried no prompt chunk (batch, seconds), the
    wall time and the load average around the run."""
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0)
    load_before, steps_before = os.getloadavg()[0], engine.steps
    start = time.perf_counter()
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, params, streamed=True)  # chats, read as they come
    arrivals: dict[str, list[float]] = {request_id: [] for request_id in prompts}
    first_token_step: dict[str, int] = {}
    decode_steps = []
    while engine.has_unfinished_requests():
        decode_only = (engine.stats().num_waiting == 0
                       and not any(s.is_prefilling for s in engine.scheduler.running))
        step_start = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        if decode_only and outputs:
            decode_steps.append((len(outputs), now - step_start))
        for out in outputs:
            arrivals[out.request_id] += [now - start] * len(out.outputs[0].delta_token_ids)
            first_token_step.setdefault(out.request_id, engine.steps - steps_before)
    return {"arrivals": arrivals, "first_token_step": first_token_step, "decode_steps": decode_steps,
            "seconds": time.perf_counter() - start,
            "steps": engine.steps - steps_before, "load_average": (load_before, os.getloadavg()[0])}


def short_figures(run: dict, shorts: list[str]) -> dict:
    ttfts = [run["arrivals"][r][0] for r in shorts]
    gaps = [later - earlier for r in shorts for earlier, later in zip(run["arrivals"][r], run["arrivals"][r][1:])]
    tokens = sum(len(a) for a in run["arrivals"].values())
    return {"short_ttft_p50_s": percentile(ttfts, 50), "short_ttft_p99_s": percentile(ttfts, 99),
            "short_ttft_p99_steps": percentile([run["first_token_step"][r] for r in shorts], 99),
            "short_itl_p50_s": percentile(gaps, 50), "short_itl_p99_s": percentile(gaps, 99),
            "output_tokens": tokens, "seconds": run["seconds"], "output_tok_s": tokens / run["seconds"],
            "steps": run["steps"],
            "idle_decode_step_s": idle_decode_step([run]),
            "decode_only_step_p50_s": (percentile([t for _, t in run["decode_steps"]], 50)
                                       if run["decode_steps"] else None),
            "load_average": run["load_average"]}


def idle_decode_step(runs: list[dict]) -> float | None:
    """Median decode-only step at the largest batch these runs decoded alone: every short chat
    decoding and nothing else (the runs' last steps, as chats finish, are smaller batches)."""
    steps = [step for run in runs for step in run["decode_steps"]]
    if not steps:
        return None
    full = max(batch for batch, _ in steps)
    return percentile([seconds for batch, seconds in steps if batch == full], 50)


def short_under_long(dtype: str, seed: int) -> None:
    rng = random.Random(seed)
    lengths = {**{f"long{i}": LONG_PROMPT for i in range(LONG_PROMPTS)},
               **{f"short{i}": rng.randint(*SHORT_PROMPT) for i in range(SHORT_CHATS)}}

    def fresh(tag: str, names: list[str]) -> dict[str, list[int]]:
        """The same lengths with new tokens for every run: no prefix-cache hits between runs."""
        tokens = random.Random(f"{seed}-{tag}")
        return {f"{tag}-{n}": [tokens.randrange(100, 49152) for _ in range(lengths[n])] for n in names}

    shorts = [n for n in lengths if n.startswith("short")]
    engines = {budget: LLMEngine(EngineConfig(model="smollm2", dtype=dtype, target_itl_ms=budget, max_num_seqs=64,
                                              max_num_batched_tokens=1024))
               for budget in ("auto", "off")}
    for budget, engine in engines.items():  # warm-up, and the budget's first step times
        run_at_once(engine, fresh(f"warm-{budget}", shorts[:4]), 8)
    rows: dict[str, dict] = {}
    alone_runs = []
    # Alternating the budgets, so a change in the machine's load shows in both.
    for name, names in (("alone", shorts), ("mix", list(lengths))):
        for budget, engine in engines.items():
            run = run_at_once(engine, fresh(f"{name}-{budget}", names), MIX_OUTPUT)
            if name == "alone":
                alone_runs.append(run)
            rows[f"{name}, budget {budget}"] = short_figures(run, [f"{name}-{budget}-{n}" for n in shorts])
            print(f"{name}, budget {budget}: {rows[f'{name}, budget {budget}']}", flush=True)
    dtype_name = str(engines["auto"].runner.dtype)[6:]
    del engines

    header = (f"{'run':22} {'TTFT p50 s':>10} {'TTFT p99 s':>10} {'ITL p50 ms':>10} {'ITL p99 ms':>10} "
              f"{'tok/s':>7} {'seconds':>8} {'steps':>6} {'load avg':>11}")
    print(f"\nshort under long: {SHORT_CHATS} chats of {SHORT_PROMPT[0]}-{SHORT_PROMPT[1]} prompt tokens, "
          f"{LONG_PROMPTS} prompts of {LONG_PROMPT}, {MIX_OUTPUT} output tokens each, SmolLM2 {dtype_name}, "
          f"{torch.get_num_threads()} threads")
    print(header)
    print("-" * len(header))
    for name, r in rows.items():
        print(f"{name:22} {r['short_ttft_p50_s']:>10.2f} {r['short_ttft_p99_s']:>10.2f} "
              f"{r['short_itl_p50_s'] * 1e3:>10.0f} {r['short_itl_p99_s'] * 1e3:>10.0f} {r['output_tok_s']:>7.1f} "
              f"{r['seconds']:>8.1f} {r['steps']:>6} {r['load_average'][0]:>5.1f}-{r['load_average'][1]:<5.1f}")
    # The budget does not change a decode-only step, so both budgets' chats alone measure it.
    idle = idle_decode_step(alone_runs)
    all_batches = percentile([t for run in alone_runs for _, t in run["decode_steps"]], 50)
    ratios = {"idle_decode_step_s": idle, "decode_only_step_all_batches_p50_s": all_batches}
    for budget in ("auto", "off"):
        alone, mix = rows[f"alone, budget {budget}"], rows[f"mix, budget {budget}"]
        ratios[budget] = {"ttft_p99_mix_over_alone": mix["short_ttft_p99_s"] / alone["short_ttft_p99_s"],
                          "itl_p99_mix_over_idle_decode_step": mix["short_itl_p99_s"] / idle,
                          "itl_p99_mix_over_decode_only_step_all_batches": mix["short_itl_p99_s"] / all_batches}
    ratios["mix_throughput_on_over_off"] = (rows["mix, budget auto"]["output_tok_s"]
                                            / rows["mix, budget off"]["output_tok_s"])
    print(f"\nidle decode step (median decode-only step of the chats alone at their full batch, both budgets): "
          f"{idle * 1e3:.0f} ms; median decode-only step at any batch: {all_batches * 1e3:.0f} ms")
    for budget in ("auto", "off"):
        r = ratios[budget]
        print(f"budget {budget}: short TTFT p99 mix/alone {r['ttft_p99_mix_over_alone']:.2f} (target <= 1.5), "
              f"short ITL p99 / idle decode step {r['itl_p99_mix_over_idle_decode_step']:.2f} (target <= 2; "
              f"{r['itl_p99_mix_over_decode_only_step_all_batches']:.2f} over the any-batch median)")
    print(f"mix throughput budget auto / off: {ratios['mix_throughput_on_over_off']:.2f} (target >= 0.9)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "engine_short_under_long.json").write_text(json.dumps(
        {"dtype": dtype_name, "torch_threads": torch.get_num_threads(), "rows": rows, "ratios": ratios}, indent=2))


LORA_ADAPTERS, LORA_RANK, LORA_CONCURRENCY = 4, 16, 32


def build_adapters(directory: Path, count: int, rank: int) -> list[Path]:
    """Random PEFT adapters of SmolLM2 (A and B both random, as a trained adapter's are non-zero)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from sluice_runtime.models.loading import resolve_model

    model = AutoModelForCausalLM.from_pretrained(str(resolve_model("smollm2")))
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    paths = []
    for i in range(count):
        torch.manual_seed(i)
        peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets,
                                                      init_lora_weights=False))
        peft_model.save_pretrained(str(directory / f"adapter{i}"))
        model = peft_model.unload()
        paths.append(directory / f"adapter{i}")
    return paths


def run_lora(engine: LLMEngine, prompts, output_len: int, concurrency: int, loras: list[str | None], tag: str) -> dict:
    """run_engine's closed loop, request i on loras[i % len(loras)]."""
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0)
    pending = list(enumerate(prompts))
    in_flight, tokens = 0, 0
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and in_flight < concurrency:
            i, prompt = pending.pop(0)
            engine.add_request(f"{tag}-{i}", prompt, params, lora=loras[i % len(loras)])
            in_flight += 1
        for out in engine.step():
            if out.finished:
                in_flight -= 1
                tokens += len(out.outputs[0].token_ids)
    elapsed = time.perf_counter() - start
    return {"requests": len(prompts), "output_tokens": tokens, "seconds": elapsed, "output_tok_s": tokens / elapsed,
            "load_average": os.getloadavg()[0]}


def lora_mix(args: argparse.Namespace) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sluice-bench-lora-") as directory:
        paths = build_adapters(Path(directory), LORA_ADAPTERS, LORA_RANK)
        engine = LLMEngine(EngineConfig(model="smollm2", dtype=args.dtype, max_num_seqs=64, max_num_batched_tokens=1024,
                                        kv_cache_memory=2 << 30, enable_lora=True, max_loras=LORA_ADAPTERS,
                                        max_lora_rank=LORA_RANK))
        names = []
        for i, path in enumerate(paths):
            names.append(f"adapter{i}")
            engine.add_lora(names[-1], str(path), engine.read_lora(str(path)))
    prompts = make_prompts(args.requests, args.min_prompt, args.max_prompt, engine.runner.cfg.vocab_size, args.seed)
    run_lora(engine, prompts[:4], 8, 4, names, "warm")  # warm-up: every adapter copied into its slot
    rows = {}
    for name, loras in (("base", [None]), (f"{LORA_ADAPTERS} adapters", names), ("base again", [None])):
        # Prompts shifted per row: no row finds another's blocks in the prefix cache.
        shifted = [[(t + len(rows) + 1) % engine.runner.cfg.vocab_size for t in p] for p in prompts]
        rows[name] = run_lora(engine, shifted, args.output_len, LORA_CONCURRENCY, loras, name.replace(" ", "-"))
        print(f"{name}: {rows[name]['output_tok_s']:.1f} tok/s (load average {rows[name]['load_average']:.1f})",
              flush=True)
    base = (rows["base"]["output_tok_s"] + rows["base again"]["output_tok_s"]) / 2
    ratio = rows[f"{LORA_ADAPTERS} adapters"]["output_tok_s"] / base
    print(f"\n{args.requests} requests at concurrency {LORA_CONCURRENCY}, {args.min_prompt}-{args.max_prompt} prompt "
          f"tokens, {args.output_len} out, SmolLM2 {str(engine.runner.dtype)[6:]}, {torch.get_num_threads()} threads")
    print(f"{LORA_ADAPTERS} rank-{LORA_RANK} adapters / base model (mean of the two base rows): {ratio:.2f} "
          f"(target >= 0.7)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "engine_lora.json").write_text(json.dumps(
        {"dtype": str(engine.runner.dtype)[6:], "torch_threads": torch.get_num_threads(), "rows": rows,
         "adapters_over_base": ratio}, indent=2))


def llama_cpp_row(args: argparse.Namespace, prompts: list[list[int]], concurrency: int, rows: dict) -> float | None:
    """llama.cpp's server on the GGUF the model comes from, as row "llama.cpp server c=N (Q4_1)" of `rows`; its
    output tok/s, or None when it failed (the error is the row: the other rows are kept)."""
    from llama_cpp_server import llama_server_binary, run_llama_server

    from sluice_runtime.models.loading import embedded_gguf

    name = f"llama.cpp server c={concurrency} (Q4_1)"
    try:
        rows[name] = run_llama_server(llama_server_binary(args.llama_server), embedded_gguf("smollm2"), prompts,
                                      args.output_len, concurrency, torch.get_num_threads())
    except Exception as exc:  # report instead of losing the other rows
        rows[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"{name}: {rows[name]}", flush=True)
    return rows[name].get("output_tok_s")


def quantization_mix(args: argparse.Namespace) -> None:
    from sluice_runtime.cpu_isa import cpu_paths

    paths = cpu_paths()
    variants = {"float32": {"dtype": "float32"}, "int8": {"dtype": "float32", "quantization": "int8"}}
    if paths.fast_bf16:
        variants["bfloat16"] = {"dtype": "bfloat16"}
    engines = {name: LLMEngine(EngineConfig(model="smollm2", max_num_seqs=64, max_num_batched_tokens=1024,
                                            kv_cache_memory=1 << 30, **config))
               for name, config in variants.items()}
    first = next(iter(engines.values()))
    vocab = first.runner.cfg.vocab_size
    prompts = make_prompts(args.requests, args.min_prompt, args.max_prompt, vocab, args.seed)
    for name, each in engines.items():
        run_engine(each, fresh_tokens(prompts[:4], vocab, f"warm-{name}"), 8, 4)
    rows: dict[str, dict] = {}
    ratios: dict[str, float] = {}
    for c in args.concurrency:
        subset = prompts[: args.sequential_requests] if c == 1 else prompts
        for name, each in engines.items():
            row = f"{name} c={c}"
            rows[row] = run_engine(each, fresh_tokens(subset, vocab, row), args.output_len, c)
            print(f"{row}: {rows[row]['output_tok_s']:.1f} tok/s, ITL {rows[row]['mean_itl_s'] * 1000:.1f} ms, "
                  f"load {rows[row]['load_average']}", flush=True)
        ratios[f"c={c}"] = rows[f"int8 c={c}"]["output_tok_s"] / rows[f"float32 c={c}"]["output_tok_s"]
        print(f"c={c}: int8 / float32 {ratios[f'c={c}']:.2f} (target >= 1.8)", flush=True)
    weights = {name: each.runner.weight_bytes for name, each in engines.items()}
    linears = engines["int8"].runner.linears
    del first, engines
    over_llama_cpp = {}
    if args.llama_cpp:
        for c in args.concurrency:
            subset = prompts[: args.sequential_requests] if c == 1 else prompts
            row = llama_cpp_row(args, subset, c, rows)
            if row is not None:
                over_llama_cpp[f"c={c}"] = rows[f"int8 c={c}"]["output_tok_s"] / row
                print(f"c={c}: int8 / llama.cpp server {over_llama_cpp[f'c={c}']:.2f} (target >= 3)", flush=True)
    print("weights MiB: " + ", ".join(f"{name} {b / 2**20:.0f}" for name, b in weights.items()))
    RESULTS.mkdir(exist_ok=True)
    summary = {"host": _host(paths), "cpu": paths.describe(), "int8_linears": linears, "rows": rows,
               "int8_over_float32": ratios, "int8_over_llama_cpp": over_llama_cpp, "weight_bytes": weights,
               "torch_threads": torch.get_num_threads(), "requests": args.requests, "output_len": args.output_len}
    (RESULTS / f"quantization-{paths.level}.json").write_text(json.dumps(summary, indent=2))


NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PARAGRAPH = ("The harbour town wakes before dawn. Fishing boats slip out past the breakwater while the bakery on "
             "the square lights its ovens, and by seven the market stalls are stacked with bread, cheese and the "
             "night's catch. Visitors arrive on the first ferry, climb the hill to the old fort, and come back down "
             "for lunch on the quay.")
CODE = ("def total_price(items, tax):\n    subtotal = 0\n    for item in items:\n        subtotal += item.price * "
        "item.quantity\n    return subtotal * (1 + tax)\n")
REPEATING = [
    "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango.",
    f"Rewrite this paragraph with 'harbour' changed to 'river', nothing else changed:\n\n{PARAGRAPH}",
    f"Rename the variable subtotal to running_total in this code and print the whole code:\n\n{CODE}",
    f"Copy this text word for word:\n\n{PARAGRAPH}",
    f"Add a docstring to this function and print the whole function:\n\n{CODE}",
    "Repeat this list exactly: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, January, February.",
    f"Rewrite this paragraph with 'bakery' changed to 'cafe', nothing else changed:\n\n{PARAGRAPH}",
    f"Rename the function total_price to order_total in this code and print the whole code:\n\n{CODE}",
]
OPEN = [
    "Write a short story about a lighthouse keeper.", "Explain how vaccines work.",
    "Describe a good weekend in the mountains.", "What makes a good teacher?",
    "Write a poem about autumn rain.", "Explain why the sky is blue.",
    "Give advice to someone starting to learn the piano.", "Describe the life cycle of a star.",
]


def speculative_mix(args: argparse.Namespace) -> None:
    from sluice_runtime.cpu_isa import cpu_paths

    engines = {name: LLMEngine(EngineConfig(model="smollm2", dtype=args.dtype, max_num_seqs=64,
                                            speculative_config=config))
               for name, config in (("plain", None), ("ngram", json.dumps(NGRAM)))}
    tok = engines["plain"].tokenizer

    def chats(texts: list[str]) -> list[list[int]]:
        return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False) for t in texts]

    workloads = {"repeating": chats(REPEATING), "open": chats(OPEN)}
    for each in engines.values():
        run_engine(each, workloads["open"][:2], 8, 2, ignore_eos=False)
    rows: dict[str, dict] = {}
    ratios: dict[str, float] = {}
    for c in args.concurrency:
        for workload, prompts in workloads.items():
            subset = prompts[: args.sequential_requests] if c == 1 else prompts
            for name, each in engines.items():
                row = f"{workload} {name} c={c}"
                before = (each.num_draft_tokens, each.num_accepted_tokens)
                rows[row] = run_engine(each, subset, args.output_len, c, ignore_eos=False)
                drafted, accepted = each.num_draft_tokens - before[0], each.num_accepted_tokens - before[1]
                rows[row]["acceptance_rate"] = accepted / drafted if drafted else None
                print(f"{row}: {rows[row]['output_tok_s']:.1f} tok/s, ITL {rows[row]['mean_itl_s'] * 1000:.1f} ms, "
                      f"acceptance {rows[row]['acceptance_rate']}, load {rows[row]['load_average']}", flush=True)
            key = f"{workload} c={c}"
            ratios[key] = rows[f"{workload} plain c={c}"]["mean_itl_s"] / rows[f"{workload} ngram c={c}"]["mean_itl_s"]
            print(f"{key}: plain ITL / ngram ITL {ratios[key]:.2f}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    paths = cpu_paths()
    summary = {"host": _host(paths), "cpu": paths.describe(), "speculative_config": NGRAM, "rows": rows, "plain_itl_over_ngram_itl": ratios,
               "torch_threads": torch.get_num_threads(), "output_len": args.output_len}
    (RESULTS / f"speculative-{paths.level}.json").write_text(json.dumps(summary, indent=2))


def _host(paths) -> dict:
    """The date, the machine and its CPU path, and the load average as a results file records them."""
    models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
              if line.startswith("model name")] if Path("/proc/cpuinfo").exists() else []
    machine = f"{len(models)}-core {models[0]}, {paths.describe()}" if models else paths.describe()
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": machine,
            "load_average": round(os.getloadavg()[0], 1)}


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
