"""Overload against one runtime directly: what clients get at 2x and 4x the rate it sustains, deadline admission
on and off, in one run.

Real processes: `sluice-runtime serve` (the embedded SmolLM2 unless --model), started once with
`--no-deadline-admission` (the "off" rows) and once with admission on; short chats (`--max-tokens`, ignore_eos),
read whole, over httpx. Each client waits up to `--client-timeout` seconds and sends the budget the gateway would
(sluice_contracts.request_deadline.BUDGET_HEADER): `--budget` seconds, by default twice the median latency at
the sustained rate, the bound this bench holds admitted requests' p99 to.

For each runtime: idle latency (sequential requests); the sustained rate (closed loop at each of `--concurrency`,
the best of them; measured on the "off" runtime, whose rates the "on" one is driven at too); then Poisson arrivals
at 2x and 4x that rate for `--duration` seconds, each followed by probes, one a second from the moment arrivals
stop, until one is answered within twice the idle latency (the recovery time). Figures per row: admitted p50/p99
(and the bound: 2x the sustained median), requests past the client timeout, refusals (503) with their latency and
Retry-After, goodput (200s per second from the first arrival to the last 200) against the sustained rate.

    python bench/overload_bench.py                       # writes bench/results/overload_bench.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from bench_process import start_runtime

from sluice_contracts.request_deadline import BUDGET_HEADER, header_value

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Outcome:
    sent_at: float
    status: int  # 0: no answer within the client timeout (or the connection failed)
    latency: float
    retry_after: int | None = None
    code: str | None = None


@dataclass
class Row:
    admission: str
    load: str
    rate: float
    sent: int
    ok: int
    refused: int
    past_timeout: int
    admitted_p50_s: float | None
    admitted_p99_s: float | None
    refusal_p50_ms: float | None
    refusal_max_ms: float | None
    retry_after_min_s: int | None
    retry_after_median_s: float | None
    refusal_codes: dict = field(default_factory=dict)
    goodput_rps: float = 0.0
    goodput_vs_sustained: float = 0.0
    recovery_s: float | None = None


def body(args) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
            "max_tokens": args.max_tokens, "ignore_eos": True}


async def one(client: httpx.AsyncClient, url: str, args, budget: float | None) -> Outcome:
    headers = {BUDGET_HEADER: header_value(budget)} if budget else {}
    sent = time.monotonic()
    try:
        response = await client.post(f"{url}/v1/chat/completions", json=body(args), headers=headers,
                                     timeout=args.client_timeout)
    except httpx.HTTPError:
        return Outcome(sent, 0, time.monotonic() - sent)
    latency = time.monotonic() - sent
    retry = response.headers.get("retry-after")
    code = None
    if response.status_code != 200:
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
    return Outcome(sent, response.status_code, latency, int(retry) if retry and retry.isdigit() else None, code)


async def idle_latency(url: str, args) -> float:
    async with httpx.AsyncClient() as client:
        await one(client, url, args, None)
        latencies = [(await one(client, url, args, None)).latency for _ in range(5)]
    return statistics.median(latencies)


async def closed_loop(url: str, args, concurrency: int) -> tuple[float, float]:
    """(requests/s, median latency) with `concurrency` clients sending back to back for --closed-seconds."""
    stop = time.monotonic() + args.closed_seconds
    latencies: list[float] = []

    async def worker(client):
        while time.monotonic() < stop:
            outcome = await one(client, url, args, None)
            if outcome.status == 200:
                latencies.append(outcome.latency)

    started = time.monotonic()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency + 8)) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return len(latencies) / (time.monotonic() - started), statistics.median(latencies) if latencies else 0.0


async def open_loop(url: str, args, rate: float, budget: float | None, idle: float) -> tuple[list[Outcome], float,
                                                                                             float | None]:
    """Poisson arrivals at `rate` for --duration s, then a probe a second until one is fast: (outcomes, first
    arrival, recovery seconds or None)."""
    rng = random.Random(args.seed)
    tasks: list[asyncio.Task] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits) as client:
        first = time.monotonic()
        stop = first + args.duration
        next_at = first
        while next_at < stop:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            tasks.append(asyncio.create_task(one(client, url, args, budget)))
            next_at += rng.expovariate(rate)
        stopped = time.monotonic()
        probes: list[asyncio.Task] = []
        recovery = None
        while recovery is None and time.monotonic() - stopped < args.client_timeout:
            probes.append(asyncio.create_task(one(client, url, args, budget)))
            await asyncio.sleep(1.0)
            for probe in probes:
                if probe.done() and (o := probe.result()).status == 200 and o.latency <= 2 * idle:
                    recovery = o.sent_at - stopped if recovery is None else min(recovery, o.sent_at - stopped)
        outcomes = await asyncio.gather(*tasks)
        for probe in probes:
            probe.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
    return list(outcomes), first, recovery


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(admission: str, load: str, rate: float, outcomes: list[Outcome], first: float, recovery: float | None,
              sustained: float, timeout: float) -> Row:
    ok = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 503]
    codes: dict[str, int] = {}
    for o in refused:
        codes[o.code or "?"] = codes.get(o.code or "?", 0) + 1
    last_ok = max((o.sent_at + o.latency for o in ok), default=first)
    goodput = len(ok) / max(1e-9, last_ok - first)
    retries = [o.retry_after for o in refused if o.retry_after is not None]
    refusal_ms = [o.latency * 1000 for o in refused]
    return Row(admission, load, round(rate, 2), len(outcomes), len(ok), len(refused),
               sum(o.status == 0 or o.latency >= timeout for o in outcomes),
               _round(percentile([o.latency for o in ok], 0.5)), _round(percentile([o.latency for o in ok], 0.99)),
               _round(percentile(refusal_ms, 0.5), 1), _round(max(refusal_ms, default=None), 1),
               min(retries, default=None), statistics.median(retries) if retries else None, codes,
               round(goodput, 2), round(goodput / sustained, 2) if sustained else 0.0,
               None if recovery is None else round(recovery, 1))


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


async def run_runtime(args, workdir: Path, admission: bool, sustained: dict | None) -> tuple[dict, list[Row]]:
    process, url = start_runtime(workdir, args.model, *([] if admission else ["--no-deadline-admission"]),
                                 log_name=f"runtime-{'on' if admission else 'off'}.log")
    name = "on" if admission else "off"
    try:
        idle = await idle_latency(url, args)
        print(f"[{name}] idle latency {idle:.3f} s", flush=True)
        if sustained is None:
            rates = {}
            for concurrency in args.concurrency:
                rates[concurrency] = await closed_loop(url, args, concurrency)
                print(f"[{name}] closed loop at {concurrency}: {rates[concurrency][0]:.2f} req/s, median "
                      f"{rates[concurrency][1]:.2f} s", flush=True)
            best = max(rates, key=lambda c: rates[c][0])
            sustained = {"concurrency": best, "rate": rates[best][0], "median_s": rates[best][1],
                         "closed_loop": {str(c): {"rate": r, "median_s": m} for c, (r, m) in rates.items()}}
        budget = args.budget if args.budget else 2 * sustained["median_s"]
        rows = []
        for factor in (2, 4):
            rate = factor * sustained["rate"]
            outcomes, first, recovery = await open_loop(url, args, rate, budget, idle)
            row = summarize(name, f"{factor}x", rate, outcomes, first, recovery, sustained["rate"],
                            args.client_timeout)
            print(f"[{name}] {factor}x: {asdict(row)}", flush=True)
            rows.append(row)
        return {"idle_s": idle, "budget_s": budget, **sustained}, rows
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def table(sustained: dict, results: dict, rows: list[Row]) -> str:
    bound = 2 * sustained["median_s"]
    lines = [f"sustained: {sustained['rate']:.2f} req/s at concurrency {sustained['concurrency']}, median "
             f"{sustained['median_s']:.2f} s (admitted p99 bound {bound:.2f} s); budget sent "
             f"{results['on']['budget_s']:.2f} s; idle {results['off']['idle_s']:.3f} s (off), "
             f"{results['on']['idle_s']:.3f} s (on)",
             "| admission | load | sent | 200 | 503 | past timeout | p50 s | p99 s | refusal p50/max ms | "
             "Retry-After min/median | goodput req/s (x sustained) | recovery s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r.admission} | {r.load} | {r.sent} | {r.ok} | {r.refused} | {r.past_timeout} | "
                     f"{r.admitted_p50_s} | {r.admitted_p99_s} | {r.refusal_p50_ms}/{r.refusal_max_ms} | "
                     f"{r.retry_after_min_s}/{r.retry_after_median_s} | {r.goodput_rps} ({r.goodput_vs_sustained}) | "
                     f"{r.recovery_s if r.recovery_s is not None else 'none'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--closed-seconds", type=float, default=10.0, help="length of each closed-loop run")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of open-loop arrivals per row")
    parser.add_argument("--client-timeout", type=float, default=60.0)
    parser.add_argument("--budget", type=float, default=None,
                        help="budget sent (s); default: twice the median latency at the sustained rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=RESULTS / "overload_bench.json")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="overload-bench-") as tmp:
        workdir = Path(tmp)
        off, off_rows = asyncio.run(run_runtime(args, workdir, False, None))
        sustained = {k: off[k] for k in ("concurrency", "rate", "median_s", "closed_loop")}
        on, on_rows = asyncio.run(run_runtime(args, workdir, True, sustained))
    results = {"off": off, "on": on}
    rows = off_rows + on_rows
    report = table(sustained, results, rows)
    print(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "command": "python bench/overload_bench.py " + " ".join(sys.argv[1:]),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "sustained": sustained, "runtimes": results, "rows": [asdict(r) for r in rows],
        "wall_s": round(time.monotonic() - started, 1)}, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
