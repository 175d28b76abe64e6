"""Load generator for any OpenAI-compatible endpoint, in the spirit of `vllm bench serve`.

Random dataset: prompts of --input-len random tokens (decoded to text with --tokenizer), each asking
for exactly --output-len tokens (ignore_eos), sent to /v1/completions as streams, either as fast as
--max-concurrency allows or at --request-rate (Poisson arrivals). Reports request throughput, output
tokens/s, TTFT, TPOT and ITL (mean, median, p99), prints a table and writes JSON (+ a PNG plot).

    python bench/serve_bench.py --base-url http://127.0.0.1:8000 --model smollm2
    python bench/serve_bench.py --start-server --compare-offline      # what `make bench-serve` runs

--start-server starts `sluice-runtime serve` on a free port; --compare-offline also runs the same
prompts through the engine's offline API (sluice_runtime.engine.llm.LLM) in this process, with the
same batch size, while the server idles, so the HTTP path's cost is measured in the same run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def make_prompts(tokenizer, count: int, input_len: int, seed: int) -> list[str]:
    """Random token ids, decoded and re-encoded until the text really is input_len tokens."""
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    prompts = []
    for _ in range(count):
        ids = [rng.choice(vocab) for _ in range(input_len)]
        text = tokenizer.decode(ids)
        ids = tokenizer.encode(text, add_special_tokens=False)[:input_len]
        prompts.append(tokenizer.decode(ids))
    return prompts


async def one_request(client: httpx.AsyncClient, args, prompt: str) -> RequestResult:
    body = {"model": args.model, "prompt": prompt, "max_tokens": args.output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    started = time.perf_counter()
    result = RequestResult(ok=False)
    last = None
    try:
        async with client.stream("POST", f"{args.base_url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - started
                    else:
                        result.itl.append(now - last)
                    last = now
    except httpx.HTTPError as exc:
        result.error = repr(exc)
        return result
    result.latency = time.perf_counter() - started
    result.ok = result.output_tokens > 0
    return result


async def run_load(args, prompts: list[str]) -> tuple[list[RequestResult], float]:
    limits = httpx.Limits(max_connections=args.max_concurrency or 1024, max_keepalive_connections=256)
    semaphore = asyncio.Semaphore(args.max_concurrency or len(prompts))
    rng = random.Random(args.seed)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600), limits=limits) as client:
        async def limited(prompt: str) -> RequestResult:
            async with semaphore:
                return await one_request(client, args, prompt)

        started = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(prompt)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - started


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"mean": statistics.fmean(ordered), "median": statistics.median(ordered), "p99": p99}


def summarize(results: list[RequestResult], duration: float) -> dict:
    done = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in done)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "completed": len(done), "failed": len(results) - len(done), "duration_s": duration,
        "request_throughput": len(done) / duration, "output_throughput": output / duration,
        "total_token_throughput": (output + sum(r.prompt_tokens for r in done)) / duration,
        "ttft_ms": {k: v * 1000 for k, v in _stats([r.ttft for r in done]).items()},
        "tpot_ms": {k: v * 1000 for k, v in _stats(tpot).items()},
        "itl_ms": {k: v * 1000 for k, v in _stats([x for r in done for x in r.itl]).items()},
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }


class OfflineEngine:
    """The same prompts through the engine's offline API, batched like the server under this load.

    The engine runs on a worker thread of its own, as it does inside the server (AsyncEngine): on a
    busy machine torch is several times slower on the main thread (OpenMP spin-waiting), which
    would otherwise dominate the comparison.
    """

    def __init__(self, args):
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-engine")
        self._worker.submit(self._load, args).result()

    def _load(self, args) -> None:
        from sluice_runtime.engine.llm import LLM
        from sluice_runtime.sampling_params import SamplingParams

        batch = min(args.max_concurrency or 256, 256)
        self._llm = LLM(args.model, dtype=args.dtype, max_num_seqs=batch, max_num_batched_tokens=max(1024, batch))
        self._params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
        self._llm.generate(["warm-up"], SamplingParams(max_tokens=2), use_tqdm=False)

    def run(self, prompts: list[str]) -> dict:
        return self._worker.submit(self._run, prompts).result()

    def _run(self, prompts: list[str]) -> dict:
        import torch

        # The server's engine loop runs under inference_mode; LLM.generate alone does not, and
        # autograd bookkeeping outside the model call made it about half as fast here.
        with torch.inference_mode():
            started = time.perf_counter()
            outputs = self._llm.generate(prompts, self._params, use_tqdm=False)
            duration = time.perf_counter() - started
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        return {"duration_s": duration, "output_throughput": generated / duration,
                "request_throughput": len(outputs) / duration}


def start_server(args) -> subprocess.Popen:
    script = Path(sys.executable).with_name("sluice-runtime")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "sluice_runtime.cli"]
    log = Path(tempfile.mkstemp(prefix="serve-bench-", suffix=".log")[1])
    out = log.open("w")
    process = subprocess.Popen(command + ["serve", "--model", args.model, "--dtype", args.dtype, "--host", "127.0.0.1",
                                          "--port", "0", "--max-num-seqs", str(min(args.max_concurrency or 256, 256))],
                               stdout=out, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        match = re.search(r"serving \S+ at (http://\S+)", log.read_text())
        if match:
            args.base_url = match.group(1)
            return process
        if process.poll() is not None:
            break
        time.sleep(0.2)
    process.kill()
    sys.exit(f"serve_bench: sluice-runtime did not start (exit {process.poll()}); see {log}")


def print_table(args, serve: dict, offline: dict | None) -> None:
    rows = [("Successful requests", f"{serve['completed']}"), ("Failed requests", f"{serve['failed']}"),
            ("Duration (s)", f"{serve['duration_s']:.2f}"),
            ("Request throughput (req/s)", f"{serve['request_throughput']:.2f}"),
            ("Output token throughput (tok/s)", f"{serve['output_throughput']:.1f}"),
            ("Total token throughput (tok/s)", f"{serve['total_token_throughput']:.1f}")]
    if "client_cpu_cores" in serve:
        rows.append(("Load generator CPU (cores busy)", f"{serve['client_cpu_cores']:.2f}"))
    for name in ("ttft_ms", "tpot_ms", "itl_ms"):
        for stat in ("mean", "median", "p99"):
            rows.append((f"{stat.capitalize()} {name[:-3].upper()} (ms)", f"{serve[name][stat]:.1f}"))
    if offline is not None:
        ratio = serve["output_throughput"] / offline["output_throughput"]
        rows += [("Offline engine output throughput (tok/s)", f"{offline['output_throughput']:.1f}"),
                 ("Server / offline output throughput", f"{ratio:.3f}"),
                 ("HTTP path cost", f"{(1 - ratio) * 100:.1f} %")]
    title = (f" Serving benchmark: {args.num_prompts} prompts x {args.input_len} in / {args.output_len} out, "
             f"concurrency {args.max_concurrency or 'unbounded'}, rate {args.request_rate} ")
    width = max(len(title), 60)
    print(title.center(width, "="))
    for name, value in rows:
        print(f"{name:<{width - 14}}{value:>14}")
    print("=" * width)


def plot(results: list[RequestResult], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    done = [r for r in results if r.ok]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].hist([r.ttft * 1000 for r in done], bins=30)
    axes[0].set_title("TTFT (ms)")
    axes[1].hist([x * 1000 for r in done for x in r.itl], bins=50)
    axes[1].set_title("Inter-token latency (ms)")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (without /v1)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokenizer", default=None,
                        help="HF tokenizer dir for making prompts (default: the model's)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=250)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=32, help="0 = unbounded")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests/s (Poisson); inf = all at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the measurement; with --compare-offline the two alternate, which evens out "
                             "a machine whose background load drifts")
    parser.add_argument("--start-server", action="store_true", help="start sluice-runtime on a free port first")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                        help="with --start-server: the server's and the offline engine's dtype")
    parser.add_argument("--compare-offline", action="store_true",
                        help="also run the prompts through the offline engine API (needs --start-server)")
    parser.add_argument("--result-json", type=Path, default=RESULTS / "serve_bench.json")
    args = parser.parse_args(argv)
    if args.compare_offline and not args.start_server:
        parser.error("--compare-offline needs --start-server: the engine and the server must not share the CPU")
    if min(args.num_prompts, args.input_len, args.output_len, args.rounds) < 1 or args.max_concurrency < 0 \
            or args.request_rate <= 0:
        parser.error("--num-prompts, --input-len, --output-len, --rounds and --request-rate must be positive")

    from transformers import AutoTokenizer

    tokenizer_path = args.tokenizer
    if tokenizer_path is None:
        from sluice_runtime.models.loading import resolve_model
        tokenizer_path = str(resolve_model(args.model))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    # Fresh prompts for every round (and the warm-up): a repeated prompt would be a prefix-cache hit
    # and skip its prefill, on the server and in the offline engine alike.
    prompt_sets = [make_prompts(tokenizer, args.num_prompts, args.input_len, args.seed + i)
                   for i in range(args.rounds + 1)]

    # Loaded before the server starts; while one side runs the other is idle, so they never share the CPU.
    offline_engine = OfflineEngine(args) if args.compare_offline else None
    server = start_server(args) if args.start_server else None
    rounds = []
    try:
        # One whole unmeasured round on each side first: the first full batch touches the KV cache
        # and activation memory for the first time, which made round 1 half as fast as round 2.
        warm_up, *measured = prompt_sets
        asyncio.run(run_load(argparse.Namespace(**{**vars(args), "request_rate": float("inf")}), warm_up))
        if offline_engine:
            offline_engine.run(warm_up)
        for prompts in measured:
            cpu_before = time.process_time()
            results, duration = asyncio.run(run_load(args, prompts))
            serve = summarize(results, duration)
            # On a small machine the load generator shares the server's cores; what it used is
            # part of what the server lost against the offline engine, which runs without it.
            serve["client_cpu_cores"] = (time.process_time() - cpu_before) / duration
            offline = offline_engine.run(prompts) if offline_engine else None
            rounds.append({"serve": serve, "offline": offline})
            print_table(args, serve, offline)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    summary = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "load_average": list(os.getloadavg()), "rounds": rounds}
    if offline_engine:
        ratios = [r["serve"]["output_throughput"] / r["offline"]["output_throughput"] for r in rounds]
        summary["median_server_over_offline"] = statistics.median(ratios)
        print(f"server / offline output throughput per round: {', '.join(f'{x:.3f}' for x in ratios)}; "
              f"median {statistics.median(ratios):.3f} (load average {os.getloadavg()[0]:.1f})")
    args.result_json.parent.mkdir(parents=True, exist_ok=True)
    args.result_json.write_text(json.dumps(summary, indent=1))
    plot(results, args.result_json.with_suffix(".png"))
    print(f"results: {args.result_json}")
    return 0 if all(r["serve"]["failed"] == 0 for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
