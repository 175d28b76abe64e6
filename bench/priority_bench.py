"""Tenant priority at saturation: a critical tenant's time to first token alone and under a batch flood,
and completions of two standard tenants with very different queue lengths. Real processes: one `sluice-runtime`
(the embedded SmolLM2 unless --model) and `sluice-gateway`s in front of it, the official openai client.

Modes, all in the same run against the same runtime:
- `classes`: a gateway with tenant A `batch`, B `critical` (the issue's scenario);
- `standard`: a gateway with every tenant `standard` (priority off, tenant fairness still on);
- `direct`: clients straight to the runtime, no priority and no tenant (everyone in one FIFO).
For each: B (4 concurrent) alone, then B while A keeps `--flood` requests in flight. Then C (32 concurrent) and D
(2 concurrent), both `standard`, for `--fair-seconds`: completions per tenant.
Writes bench/results/priority_bench.json and prints a table. Figures are ratios within this run.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import openai
import yaml
from bench_process import free_port, script, start_runtime, wait_http

ROOT = Path(__file__).resolve().parent.parent
KEYS = {name: f"sk-bench-{name}" for name in "ABCD"}
PROMPT = [{"role": "user", "content": "Write one sentence about rivers."}]



def start_gateway(runtime_url: str, classes: dict[str, str], workdir: Path, name: str) -> tuple[subprocess.Popen, str]:
    tenants = [{"name": f"tenant-{t}", "priority": classes[t], "models": ["*"],
                "keys": [{"id": t, "sha256": hashlib.sha256(KEYS[t].encode()).hexdigest()}]} for t in KEYS]
    config = {"tenants": tenants, "routing": {"poll_interval_s": 0.25}, "access_log": False,
              # A preempted stream is silent until it is admitted again: on a loaded 2-core machine that can take
              # longer than the default idle_s, which would cut streams the runtime still serves.
              "timeouts": {"first_byte_s": 600, "idle_s": 600, "total_s": 900}}
    (workdir / f"{name}.yaml").write_text(yaml.safe_dump(config))
    routes = {"version": 1, "generation": 1,
              "routes": {"m": {"affinity": "none", "backends": [{"name": "m", "servedModelName": "m", "weight": 1,
                                                                 "endpoints": [runtime_url]}]}}}
    (workdir / f"{name}-routes.json").write_text(json.dumps(routes))
    port = free_port()
    metrics_port = free_port()
    process = subprocess.Popen(
        [script("sluice-gateway"), "--config", str(workdir / f"{name}.yaml"), "--routes",
         str(workdir / f"{name}-routes.json"), "--host", "127.0.0.1", "--port", str(port), "--metrics-port",
         str(metrics_port)],
        stdout=(workdir / f"{name}.log").open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/ready", process, 600)
    return process, url


class Tenant:
    def __init__(self, base_url: str, key: str):
        self.client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=900)
        self.ttfts: list[float] = []
        self.outcomes: dict[str, int] = {}

    async def one(self, max_tokens: int) -> None:
        started = time.perf_counter()
        try:
            stream = await self.client.chat.completions.create(
                model="m", messages=PROMPT, max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True})
            first = None
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - started
            self.ttfts.append(first if first is not None else time.perf_counter() - started)
            self.count("ok")
        except openai.APIStatusError as err:
            self.count(str(err.status_code))
            if err.status_code in (429, 503):
                await asyncio.sleep(min(float(err.response.headers.get("retry-after", 1)), 2))
        except openai.APIError as err:
            self.count(f"{type(err).__name__}: {str(err)[:80]}")

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    async def loop(self, concurrency: int, max_tokens: int, stop: asyncio.Event) -> None:
        async def worker():
            while not stop.is_set():
                await self.one(max_tokens)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def batch(self, concurrency: int, total: int, max_tokens: int) -> None:
        remaining = total

        async def worker():
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await self.one(max_tokens)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def ttft_phase(url_for: dict[str, str], args, flood: bool) -> dict:
    b = Tenant(url_for["B"], KEYS["B"])
    a = Tenant(url_for["A"], KEYS["A"])
    stop = asyncio.Event()
    flood_task = asyncio.create_task(a.loop(args.flood, args.flood_tokens, stop)) if flood else None
    if flood:
        await asyncio.sleep(args.warmup)
    await b.batch(4, args.critical_requests, args.critical_tokens)
    stop.set()
    if flood_task:
        await flood_task
    await asyncio.gather(a.client.close(), b.client.close())
    return {"b_ttft_p50": statistics.median(b.ttfts) if b.ttfts else None, "b_ttft_p99": pct(b.ttfts, 0.99),
            "b_outcomes": b.outcomes, "a_outcomes": a.outcomes}


async def fairness_phase(url: str, args) -> dict:
    c, d = Tenant(url, KEYS["C"]), Tenant(url, KEYS["D"])
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.loop(32, args.fair_tokens, stop)), asyncio.create_task(d.loop(2, args.fair_tokens, stop))]
    await asyncio.sleep(args.fair_seconds)
    stop.set()
    await asyncio.gather(*tasks)
    await asyncio.gather(c.client.close(), d.client.close())
    return {"c_completions": c.outcomes.get("ok", 0), "d_completions": d.outcomes.get("ok", 0),
            "c_outcomes": c.outcomes, "d_outcomes": d.outcomes}


def wait_idle(runtime_url: str) -> None:
    while True:
        load = httpx.get(f"{runtime_url}/load", timeout=10).json()
        if not load["running"] and not load["waiting"]:
            return
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-num-seqs", type=int, default=4, help="the runtime's batch: small, so it saturates")
    parser.add_argument("--flood", type=int, default=64, help="tenant A's requests in flight")
    parser.add_argument("--flood-tokens", type=int, default=32)
    parser.add_argument("--critical-requests", type=int, default=12)
    parser.add_argument("--critical-tokens", type=int, default=8)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of flood before B starts")
    parser.add_argument("--fair-seconds", type=float, default=40.0)
    parser.add_argument("--fair-tokens", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "bench/results/priority_bench.json"))
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="sluice-priority-bench-"))
    processes = []
    try:
        runtime, runtime_url = start_runtime(workdir, args.model, "--max-num-seqs", str(args.max_num_seqs))
        processes.append(runtime)
        with_classes = {"A": "batch", "B": "critical", "C": "standard", "D": "standard"}
        gw_classes, classes_url = start_gateway(runtime_url, with_classes, workdir, "classes")
        gw_standard, standard_url = start_gateway(runtime_url, dict.fromkeys(KEYS, "standard"), workdir, "standard")
        processes += [gw_classes, gw_standard]
        modes = {"classes": dict.fromkeys(KEYS, classes_url), "standard": dict.fromkeys(KEYS, standard_url),
                 "direct": dict.fromkeys(KEYS, runtime_url)}
        results: dict = {"config": vars(args), "load_average": os.getloadavg(), "modes": {}}
        for mode, urls in modes.items():
            row = {}
            for phase, flood in (("idle", False), ("flood", True)):
                wait_idle(runtime_url)
                row[phase] = asyncio.run(ttft_phase(urls, args, flood))
                print(mode, phase, json.dumps(row[phase]), flush=True)
            results["modes"][mode] = row
        wait_idle(runtime_url)
        results["fairness"] = asyncio.run(fairness_phase(classes_url, args))
        print("fairness", json.dumps(results["fairness"]), flush=True)
        results["load_average_after"] = os.getloadavg()
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)

    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print("\n| mode | B TTFT p50 idle | B TTFT p50 under flood | ratio | A outcomes under flood |")
    print("| --- | --- | --- | --- | --- |")
    for mode, row in results["modes"].items():
        idle, flood = row["idle"]["b_ttft_p50"], row["flood"]["b_ttft_p50"]
        ratio = flood / idle if idle and flood else float("nan")
        print(f"| {mode} | {idle:.3f} s | {flood:.3f} s | {ratio:.2f}x | {row['flood']['a_outcomes']} |")
    fair = results["fairness"]
    print(f"\nstandard tenants, 32 vs 2 concurrent: {fair['c_completions']} vs {fair['d_completions']} completions")


if __name__ == "__main__":
    main()
