"""What tracing costs the gateway: its latency with OpenTelemetry tracing off, and on with every request sampled
and exported over OTLP/HTTP to a real Jaeger, in one run.

Two gateways in front of one fake OpenAI backend (bench/fake_openai_backend.py, which answers at once), one of
them started with the standard OTEL_* environment (OTEL_TRACES_SAMPLER=always_on), exporting to the Jaeger of the
traces tests (tests/fixtures/jaeger.py: the all-in-one binary, traces in memory, on loopback), which counts what
it stores. One client at a time, JSON and streaming, the two gateways measured in turn in each round; medians
over rounds. Writes bench/results/tracing_bench.json.

`python bench/tracing_bench.py [--rounds 5] [--seconds 3]`
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_process import free_port, wait_http
from gateway_bench import PAYLOAD, TENANT_KEY, load, start_fake_backend, write_sluice_gateway_files

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fixtures.jaeger import start_jaeger  # noqa: E402


def span_work_us(environ: dict[str, str], requests: int = 2000, repeats: int = 7) -> dict[str, float]:
    """The gateway's own span work for one request (four steps marked with their attributes, the attempt's
    upstream context, then its five spans handed to the exporter), in this process: microseconds per request, tracing off and on
    (the best of `repeats`, which a contended machine disturbs least)."""
    from sluice_contracts.trace_context import new_trace
    from sluice_gateway.request_spans import NO_SPANS, RequestSpans
    from sluice_gateway.tracing_setup import tracing_from_environment

    os.environ.update(environ)
    tracing = tracing_from_environment()

    def one(spans) -> None:
        for name in ("auth", "route", "limits"):
            with spans.step(name) as span:
                if span.is_recording():
                    span.set_attributes({"sluice.tenant": "bench", "sluice.key_id": "bench-key"})
        with spans.step("upstream attempt") as span:
            spans.upstream(span, trace).headers()
            if span.is_recording():
                span.set_attributes({"sluice.attempt": 1, "sluice.backend": "fake", "http.response.status_code": 200})
        if spans.root.is_recording():
            spans.root.set_attributes({"http.response.status_code": 200, "gen_ai.request.model": "bench"})
        spans.finish()

    trace = new_trace()
    figures = {}
    for name, make in (("off", lambda: NO_SPANS), ("on", lambda: RequestSpans(tracing, None, "POST /v1/chat"))):
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(requests):
                one(make())
            best = min(best, (time.perf_counter() - started) / requests)
        figures[f"{name}_us"] = best * 1e6
    tracing.shutdown()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per cell")
    parser.add_argument("--rounds", type=int, default=5, help="repeat both gateways in turn; report medians")
    parser.add_argument("--max-requests", type=int, default=20000, help="cap per cell")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tracing_bench.json")
    args = parser.parse_args()
    # Every traced request is a trace of its own: room for all of them, so none is evicted before it is counted.
    with start_jaeger(max_traces=args.rounds * 2 * args.max_requests) as jaeger:
        run(args, jaeger)


def run(args: argparse.Namespace, jaeger) -> None:
    procs: list[subprocess.Popen] = []
    workdir = Path(tempfile.mkdtemp(prefix="sluice-tracebench-"))
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    try:
        backend = start_fake_backend(procs, quiet)
        write_sluice_gateway_files(workdir, backend)
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                  "OTEL_TRACES_SAMPLER": "always_on"}
        targets = {}
        for name, env in (("off", plain_env), ("on", {**plain_env, **traced})):
            port = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "sluice_gateway.cli", "--config", str(workdir / "gateway.yaml"),
                 "--routes", str(workdir / "routes.json"), "--host", "127.0.0.1", "--port", str(port),
                 "--metrics-port", "0"], env=env, **quiet))
            wait_http(f"http://127.0.0.1:{port}/ready", procs[-1], 30)
            targets[name] = f"http://127.0.0.1:{port}/v1/chat/completions"

        headers = {"authorization": f"Bearer {TENANT_KEY}"}
        runs: dict[tuple, list[dict]] = {}
        loads = [os.getloadavg()[0]]
        for round_ in range(args.rounds):
            for stream in (False, True):
                body = json.dumps({**PAYLOAD, "stream": stream}).encode()
                for name, url in targets.items():
                    cell = asyncio.run(load(url, headers, body, stream, 1, args.seconds, args.max_requests))
                    runs.setdefault((name, stream), []).append(cell)
                    print(f"  round {round_ + 1} tracing {name:3s} stream={stream!s:5s} {cell['rps']:7.0f} req/s "
                          f"p50 {cell['p50_ms']:6.3f} ms p99 {cell['p99_ms']:6.3f} ms errors {cell['errors']}",
                          flush=True)
            loads.append(os.getloadavg()[0])
        time.sleep(6)  # past the SDK's batch delay (5 s), so the gateway's last spans are in
        exported = jaeger.stored_spans()
        work = span_work_us(traced)
        print(f"span work per request, in process: {work['off_us']:.2f} µs off, {work['on_us']:.1f} µs on")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    cells = [{"tracing": name, "stream": stream, "rounds": len(c), "requests": sum(x["requests"] for x in c),
              "errors": sum(x["errors"] for x in c),
              **{k: statistics.median(x[k] for x in c) for k in ("rps", "p50_ms", "p99_ms")},
              # The added p50 of each round, on minus off measured back to back: drifts in load hit both alike.
              **({"added_p50_ms_by_round": [on["p50_ms"] - off["p50_ms"]
                                            for on, off in zip(c, runs[("off", stream)])]} if name == "on" else {})}
             for (name, stream), c in runs.items()]
    summary = {}
    for cell in cells:
        if cell["tracing"] == "on":
            mode = "stream" if cell["stream"] else "json"
            summary[mode] = {"added_p50_ms": statistics.median(cell["added_p50_ms_by_round"]),
                             "off_p50_ms": next(c["p50_ms"] for c in cells
                                                if c["tracing"] == "off" and c["stream"] == cell["stream"]),
                             "on_p50_ms": cell["p50_ms"]}
            print(f"{mode:6s}: tracing adds {summary[mode]['added_p50_ms']:.3f} ms at p50 "
                  f"({summary[mode]['off_p50_ms']:.3f} → {summary[mode]['on_p50_ms']:.3f} ms)")
    traced_requests = sum(c["requests"] + 50 * c["rounds"] for c in cells if c["tracing"] == "on")
    host = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "cpus": os.cpu_count(),
            "load_average": [round(a, 1) for a in loads]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"host": host, "cells": cells, "summary": summary, "span_work": work,
                                    "collector": "jaeger", "spans_stored": exported, "traced_requests": traced_requests}, indent=2))
    print(f"{exported} spans stored in Jaeger for {traced_requests} traced requests; wrote {args.out}")


if __name__ == "__main__":
    main()
