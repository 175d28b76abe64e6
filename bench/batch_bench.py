"""Offline batch beside online chats, through OpenAI's Files and Batches API. Real processes: one `sluice-runtime`
(the embedded SmolLM2 unless --model) and two `sluice-gateway`s in front of it, the official openai client:
`batch-gw` runs the batch lines (its executor, `batch.concurrency` lines at once, at the `batch` priority class),
`online-gw` serves the online chats and runs no batch (a database of its own), as two replicas of one gateway would
when the chats land on the other.

In one run:
- throughput: a `--lines` batch on the otherwise idle replica, against the same prompts (rendered with the model's
  chat template) sent as one offline `LLM.generate` call in this process before the runtime starts, each side
  warmed up first; `--throughput-rounds` rounds with fresh prompts each (a repeated prompt would be a prefix-cache
  hit);
- online TTFT: while a second `--lines` batch runs, rounds of `--chats` streamed chats one after another (each
  `--chat-gap` s after the last), alternating with the same chats with no batch (`batch-gw` stopped with SIGSTOP
  and the runtime drained; SIGCONT resumes the batch where it was, its leases still held), so both see the same
  drift of the machine's load. The batch is cancelled after the last round: the throughput phase already ran one
  to the end.

Writes bench/results/batch_bench.json and prints the figures. Targets (the issue): online TTFT p50 and p99 with the
batch within 1.3x of without it; the batch at least 80 % of the offline call's output tokens/s.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import yaml
from bench_process import free_port, script, start_runtime, wait_http

from sluice_contracts import metric_names

ROOT = Path(__file__).resolve().parent.parent
KEYS = {"online": "sk-bench-online", "batch": "sk-bench-batch"}
_WORDS = ("river", "lamp", "cedar", "orbit", "violin", "harbor", "granite", "meadow", "comet", "lantern", "glacier",
          "copper", "falcon", "pepper", "tundra", "marble", "saddle", "walnut", "canyon", "ember", "thistle", "quartz")
_FINISHED = ("completed", "failed", "expired", "cancelled")



def host() -> dict:
    models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
              if line.startswith("model name")] if Path("/proc/cpuinfo").exists() else []
    machine = f"{len(models)}-core {models[0]}" if models else f"{os.cpu_count()} cores"
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": machine}


def prompts(count: int, seed: int) -> list[str]:
    """Distinct short questions: two random words each, so no two share more than the chat template's prefix."""
    rng = random.Random(seed)
    return [f"Write one sentence about a {rng.choice(_WORDS)} and a {rng.choice(_WORDS)}, case {seed}-{n}."
            for n in range(count)]


def start_gateway(runtime_url: str, args, workdir: Path, name: str) -> tuple[subprocess.Popen, str]:
    home = workdir / name
    home.mkdir()
    tenants = [{"name": tenant, "models": ["*"], "keys": [{"id": tenant, "sha256": hashlib.sha256(key.encode()).hexdigest()}]}
               for tenant, key in KEYS.items()]
    batch = {"max_file_lines": max(args.lines, 1000)}
    if args.concurrency is not None:
        batch["concurrency"] = args.concurrency
    config = {"tenants": tenants, "routing": {"poll_interval_s": 0.25}, "access_log": False, "batch": batch,
              "timeouts": {"first_byte_s": 600, "idle_s": 600, "total_s": 900}}
    (home / "gateway.yaml").write_text(yaml.safe_dump(config))
    routes = {"version": 1, "generation": 1,
              "routes": {"m": {"affinity": "none", "backends": [{"name": "m", "servedModelName": "m", "weight": 1,
                                                                 "endpoints": [runtime_url]}]}}}
    (home / "routes.json").write_text(json.dumps(routes))
    port, metrics_port = free_port(), free_port()
    process = subprocess.Popen(
        [script("sluice-gateway"), "--config", str(home / "gateway.yaml"), "--routes", str(home / "routes.json"),
         "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port)],
        stdout=(home / "gateway.log").open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/ready", process, 600)
    return process, url


class OfflineEngine:
    """`LLM.generate` in this process, on a worker thread of its own as the runtime's engine runs (a busy machine
    slows torch on the main thread), under inference_mode as the runtime's engine loop is."""

    def __init__(self, args):
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-engine")
        self._worker.submit(self._load, args).result()

    def _load(self, args) -> None:
        from sluice_runtime.engine.llm import LLM
        from sluice_runtime.sampling_params import SamplingParams

        # One call holds every prompt: more than the engine's queue takes by default (max_waiting).
        self._llm = LLM(args.model, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                        max_waiting=max(args.lines, 2 * args.max_num_seqs))
        self._params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
        self._llm.generate(["warm-up"], SamplingParams(max_tokens=2), use_tqdm=False)
        for number in range(2):  # as warm_runtime does
            self._run(prompts(2 * args.max_num_seqs, -1 - number))

    def run(self, questions: list[str]) -> dict:
        return self._worker.submit(self._run, questions).result()

    def _run(self, questions: list[str]) -> dict:
        import torch

        tokenizer = self._llm.tokenizer
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               tokenize=False) for q in questions]
        with torch.inference_mode():
            started = time.perf_counter()
            outputs = self._llm.generate(texts, self._params, use_tqdm=False)
            duration = time.perf_counter() - started
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        return {"lines": len(outputs), "duration_s": duration, "output_tokens": generated,
                "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
                "output_tok_s": generated / duration, "lines_s": len(outputs) / duration,
                "load_average": os.getloadavg()}


async def warm_runtime(runtime_url: str, args) -> None:
    """What the offline engine's warm-up does, on the runtime: full batches of fresh prompts, unmeasured (the first
    full batches touch the KV cache and activation memory for the first time, and run several times slower)."""
    client = openai.AsyncOpenAI(base_url=f"{runtime_url}/v1", api_key="unused", max_retries=0, timeout=3600)
    for number in range(2):
        # A cold runtime's estimate of its queue can refuse a few of them (deadline admission): warm all the same.
        await asyncio.gather(*(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": q}], max_tokens=args.max_tokens, temperature=0,
            extra_body={"ignore_eos": True}) for q in prompts(2 * args.max_num_seqs, -1 - number)),
            return_exceptions=True)
    await client.close()


def batch_input(questions: list[str], max_tokens: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": "m", "messages": [{"role": "user", "content": q}],
                                        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}) + "\n"
                   for n, q in enumerate(questions)).encode()


def create_batch(client: openai.OpenAI, questions: list[str], max_tokens: int) -> str:
    uploaded = client.files.create(file=("lines.jsonl", io.BytesIO(batch_input(questions, max_tokens))),
                                   purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h").id


def batch_run(client: openai.OpenAI, questions: list[str], max_tokens: int) -> dict:
    """One batch from upload to its last poll; its output tokens from the output file."""
    started = time.perf_counter()
    batch_id = create_batch(client, questions, max_tokens)
    while (batch := client.batches.retrieve(batch_id)).status not in _FINISHED:
        time.sleep(0.25)
    duration = time.perf_counter() - started
    output = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()] \
        if batch.output_file_id else []
    usage = [line["response"]["body"]["usage"] for line in output]
    generated = sum(u["completion_tokens"] for u in usage)
    counts = batch.request_counts
    return {"status": batch.status, "completed": counts.completed, "failed": counts.failed,
            "duration_s": duration, "output_tokens": generated, "prompt_tokens": sum(u["prompt_tokens"] for u in usage),
            "output_tok_s": generated / duration, "lines_s": counts.completed / duration,
            "load_average": os.getloadavg()}


async def chat_round(url: str, args, name: str) -> dict:
    """`--chats` streamed chats one after another: each TTFT is the engine's answer to one arrival, not a queue
    of the round's own chats. Each chat is new (`name` and its number), so none is a prefix-cache hit."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEYS["online"], max_retries=0, timeout=600)
    ttfts, outcomes = [], {}
    rng = random.Random(name)
    for number in range(args.chats):
        started = time.perf_counter()
        try:
            stream = await client.chat.completions.create(
                model="m", max_tokens=args.chat_tokens, stream=True, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": f"Tell me about a {rng.choice(_WORDS)}, case {name}-{number}."}])
            first = None
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - started
            ttfts.append(first if first is not None else time.perf_counter() - started)
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except openai.APIError as err:
            what = str(getattr(err, "status_code", type(err).__name__))
            outcomes[what] = outcomes.get(what, 0) + 1
        await asyncio.sleep(args.chat_gap)
    await client.close()
    return {"ttfts": ttfts, "outcomes": outcomes, "load_average": os.getloadavg()}


def cpu_s(process: subprocess.Popen) -> float:
    """CPU seconds `process` has used (user and system)."""
    fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_of(runtime_url: str) -> dict:
    return httpx.get(f"{runtime_url}/load", timeout=10).json()


def wait_until(runtime_url: str, done, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done(load_of(runtime_url)) and time.monotonic() < deadline:
        time.sleep(0.1)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def steps_interrupted(runtime_url: str) -> float:
    """The runtime's count of batch-only steps abandoned for an online arrival (their work is recomputed)."""
    name = f"{metric_names.STEPS_INTERRUPTED}_total"
    for line in httpx.get(f"{runtime_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise SystemExit(f"{name} is not in the runtime's /metrics")


def ttft_phase(args, runtime_url: str, online_url: str, batch_gw: subprocess.Popen, batch_client: openai.OpenAI) -> dict:
    interrupted_before = steps_interrupted(runtime_url)
    batch_id = create_batch(batch_client, prompts(args.lines, 1000), args.max_tokens)
    rounds = []
    try:
        for number in range(args.ttft_rounds):
            for case in ("alone", "with_batch"):
                if case == "alone":
                    batch_gw.send_signal(signal.SIGSTOP)
                    wait_until(runtime_url, lambda load: not load["running"] and not load["waiting"])
                else:
                    batch_gw.send_signal(signal.SIGCONT)
                    wait_until(runtime_url, lambda load: load["running"] > 0, 30)
                round_ = asyncio.run(chat_round(online_url, args, f"{case}-{number}"))
                round_.update(case=case, round=number, batch_running=load_of(runtime_url)["running"])
                print(f"round {number} {case}: TTFT p50 {statistics.median(round_['ttfts']):.3f} s, "
                      f"max {max(round_['ttfts']):.3f} s, load {round_['load_average'][0]:.1f}", flush=True)
                rounds.append(round_)
    finally:
        batch_gw.send_signal(signal.SIGCONT)
    progress = batch_client.batches.retrieve(batch_id).request_counts
    batch_client.batches.cancel(batch_id)
    summary: dict = {"rounds": rounds, "batch_lines_done_before_cancel": progress.completed + progress.failed,
                     "steps_interrupted": steps_interrupted(runtime_url) - interrupted_before}
    for case in ("alone", "with_batch"):
        ttfts = [t for r in rounds if r["case"] == case for t in r["ttfts"]]
        summary[case] = {"chats": len(ttfts), "ttft_p50_s": statistics.median(ttfts), "ttft_p99_s": pct(ttfts, 0.99)}
    summary["p50_ratio"] = summary["with_batch"]["ttft_p50_s"] / summary["alone"]["ttft_p50_s"]
    summary["p99_ratio"] = summary["with_batch"]["ttft_p99_s"] / summary["alone"]["ttft_p99_s"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32", help="the runtime's and the offline engine's")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the runtime's and the offline engine's batch")
    parser.add_argument("--lines", type=int, default=2000, help="lines of each batch")
    parser.add_argument("--max-tokens", type=int, default=8, help="each batch line's max_tokens (ignore_eos)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="batch.concurrency of the batch gateway (default: the gateway's)")
    parser.add_argument("--throughput-rounds", type=int, default=1)
    parser.add_argument("--ttft-rounds", type=int, default=3)
    parser.add_argument("--chats", type=int, default=10, help="online chats per round")
    parser.add_argument("--chat-tokens", type=int, default=16)
    parser.add_argument("--chat-gap", type=float, default=0.5, help="seconds between one chat's end and the next")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/batch_bench.json")
    args = parser.parse_args()
    if min(args.lines, args.max_tokens, args.throughput_rounds, args.ttft_rounds, args.chats, args.chat_tokens) < 1:
        parser.error("--lines, --max-tokens, --throughput-rounds, --ttft-rounds, --chats and --chat-tokens must be "
                     "at least 1")

    workdir = Path(tempfile.mkdtemp(prefix="sluice-batch-bench-"))
    load_before = os.getloadavg()
    # Every offline round runs before the runtime starts: the engine in this process ran several times slower
    # beside an idle runtime and two gateways than alone.
    offline = OfflineEngine(args)
    rounds = [{"offline": offline.run(prompts(args.lines, number))} for number in range(args.throughput_rounds)]
    for row in rounds:
        print(f"offline: {row['offline']['output_tok_s']:.1f} output tok/s", flush=True)
    del offline
    processes: list[subprocess.Popen] = []
    try:
        runtime, runtime_url = start_runtime(workdir, args.model, "--dtype", args.dtype, "--max-num-seqs", str(args.max_num_seqs))
        processes.append(runtime)
        batch_gw, batch_url = start_gateway(runtime_url, args, workdir, "batch-gw")
        online_gw, online_url = start_gateway(runtime_url, args, workdir, "online-gw")
        processes += [batch_gw, online_gw]
        asyncio.run(warm_runtime(runtime_url, args))
        batch_client = openai.OpenAI(base_url=f"{batch_url}/v1", api_key=KEYS["batch"], max_retries=2, timeout=600)
        for number, row in enumerate(rounds):
            wait_until(runtime_url, lambda load: not load["running"] and not load["waiting"])
            gateway_cpu = cpu_s(batch_gw)
            row["batch"] = batch_run(batch_client, prompts(args.lines, number), args.max_tokens)
            # What the batch gateway's own work takes from the cores the engine computes on.
            row["batch"]["gateway_cpu_ms_per_line"] = 1000 * (cpu_s(batch_gw) - gateway_cpu) / args.lines
            row["ratio"] = row["batch"]["output_tok_s"] / row["offline"]["output_tok_s"]
            print(f"batch: {row['batch']['output_tok_s']:.1f} output tok/s ({row['batch']['status']}); "
                  f"batch / offline {row['ratio']:.2f}; batch gateway CPU "
                  f"{row['batch']['gateway_cpu_ms_per_line']:.2f} ms a line", flush=True)
        throughput = rounds
        ttft = ttft_phase(args, runtime_url, online_url, batch_gw, batch_client)
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)
            process.terminate()
        for process in processes:
            process.wait(timeout=60)

    results = {"host": host(), "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "load_average": load_before, "load_average_after": os.getloadavg(), "throughput": throughput,
               "throughput_ratio": statistics.median(row["ratio"] for row in throughput), "ttft": ttft}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nonline TTFT p50 alone {ttft['alone']['ttft_p50_s']:.3f} s, with the batch "
          f"{ttft['with_batch']['ttft_p50_s']:.3f} s ({ttft['p50_ratio']:.2f}x); p99 {ttft['alone']['ttft_p99_s']:.3f}"
          f" s, {ttft['with_batch']['ttft_p99_s']:.3f} s ({ttft['p99_ratio']:.2f}x); target within 1.3x")
    print(f"batch / offline LLM.generate output tok/s: {results['throughput_ratio']:.2f}; target at least 0.8")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
