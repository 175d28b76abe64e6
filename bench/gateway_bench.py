"""Gateway overhead: direct to a fake OpenAI backend vs through Sluice's gateway vs through LiteLLM proxy.

Same machine, same run, same backend (bench/fake_openai_backend.py, a deliberate fake that answers at once
so only the proxies' cost shows). Both proxies run one worker process. For concurrency 1, 16 and 64, streaming
and not, it reports latency p50/p99, the latency each proxy adds over direct, and requests/s; then
Sluice/LiteLLM ratios. Writes bench/results/gateway_bench.json and a PNG plot.

LiteLLM is installed pinned into its own venv (default /tmp/sluice-litellm-venv) so it never touches the
project's environment; `--no-litellm` skips it.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from bench_process import free_port, wait_http

ROOT = Path(__file__).resolve().parent.parent
LITELLM_PIN = "litellm[proxy]==1.108.7"
TENANT_KEY = "sk-bench-tenant"
LITELLM_KEY = "sk-bench-master"
PAYLOAD = {"model": "bench", "max_tokens": 8,
           "messages": [{"role": "user", "content": "Say something short about gateways."}]}


def rss_mib(process: subprocess.Popen) -> float:
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# LiteLLM as its production guide (docs.litellm.ai/docs/proxy/prod) has it run: debug logging off, FastAPI's info
# logs off, no spend or error logs written, one uvicorn worker per pod (Kubernetes); the model priced, so the
# cost tracking every request runs finds a price instead of failing a lookup for an unknown model, and the
# packaged cost map, so the start fetches nothing from the network.
LITELLM_ENV = {"LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MODE": "PRODUCTION"}


def litellm_config(backend: str) -> dict:
    return {
        "model_list": [{"model_name": "bench",
                        "litellm_params": {"model": "openai/bench", "api_base": f"{backend}/v1", "api_key": "fake"},
                        "model_info": {"input_cost_per_token": 0, "output_cost_per_token": 0}}],
        "general_settings": {"master_key": LITELLM_KEY, "disable_spend_logs": True, "disable_error_logs": True,
                             "proxy_batch_write_at": 60},
        "litellm_settings": {"set_verbose": False, "json_logs": True, "request_timeout": 600},
    }


def litellm_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                               capture_output=True, text=True).stdout.strip()
    if installed != LITELLM_PIN.rpartition("==")[2]:
        print(f"installing {LITELLM_PIN} into {venv} (once) ...", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LITELLM_PIN], check=True)
    return python


async def load(url: str, headers: dict, body: bytes, stream: bool, concurrency: int, seconds: float,
               max_requests: int) -> dict:
    """Closed loop: `concurrency` clients each send the next request when the previous one has fully arrived."""
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers={**headers, "content-type": "application/json"}) as s:
        async def one() -> None:
            nonlocal errors
            t0 = time.perf_counter()
            async with s.post(url, data=body) as resp:
                data = await resp.read()
                if resp.status != 200 or (stream and not data.rstrip().endswith(b"[DONE]")):
                    errors += 1
                    return
            latencies.append(time.perf_counter() - t0)

        for _ in range(min(50, max_requests)):  # warm the pools on both hops
            await one()
        latencies.clear()
        stop = time.perf_counter() + seconds
        started = time.perf_counter()
        count = 0

        async def client() -> None:
            nonlocal count
            while time.perf_counter() < stop and count < max_requests:
                count += 1
                await one()

        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": len(latencies), "errors": errors, "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def start_fake_backend(procs: list[subprocess.Popen], quiet: dict) -> str:
    """The fake OpenAI backend the gateways forward to, started and answering; its URL."""
    port = free_port()
    procs.append(subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "fake_openai_backend.py"), "--port", str(port)], **quiet))
    backend = f"http://127.0.0.1:{port}"
    wait_http(f"{backend}/load", procs[-1], 20)
    return backend


def write_sluice_gateway_files(workdir: Path, backend: str) -> None:
    """Sluice's gateway.yaml (one tenant, limits out of the way) and routes.json (the route `bench` to `backend`)."""
    digest = hashlib.sha256(TENANT_KEY.encode()).hexdigest()
    (workdir / "gateway.yaml").write_text(
        "tenants:\n  - name: bench\n"
        f"    keys: [{{id: bench-key, sha256: {digest}}}]\n"
        "    models: [bench]\n"
        "    limits: {requests_per_minute: 100000000, tokens_per_minute: 1000000000, max_concurrent: 10000}\n"
    )
    (workdir / "routes.json").write_text(json.dumps({"version": 1, "generation": 1, "routes": {"bench": {
        "backends": [{"name": "fake", "servedModelName": "bench", "endpoints": [backend]}]}}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per cell")
    parser.add_argument("--max-requests", type=int, default=20000, help="cap per cell")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=3, help="repeat the whole matrix; report medians")
    parser.add_argument("--litellm-venv", type=Path, default=Path("/tmp/sluice-litellm-venv"))
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateway_bench.json")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    procs: list[subprocess.Popen] = []
    workdir = Path(tempfile.mkdtemp(prefix="sluice-gwbench-"))
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    try:
        backend = start_fake_backend(procs, quiet)
        write_sluice_gateway_files(workdir, backend)
        sluice_port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "sluice_gateway.cli", "--config", str(workdir / "gateway.yaml"),
             "--routes", str(workdir / "routes.json"), "--host", "127.0.0.1", "--port", str(sluice_port)],
            **quiet))  # default log level: the JSON access log is written, as in production
        sluice = f"http://127.0.0.1:{sluice_port}"
        wait_http(f"{sluice}/ready", procs[-1], 30)

        proxies = {"sluice": procs[-1]}
        targets = {
            "direct": (f"{backend}/v1/chat/completions", {}),
            "sluice": (f"{sluice}/v1/chat/completions", {"authorization": f"Bearer {TENANT_KEY}"}),
        }
        if not args.no_litellm:
            python = litellm_python(args.litellm_venv)
            (workdir / "litellm.yaml").write_text(json.dumps(litellm_config(backend)))
            litellm_port = free_port()
            env = {**os.environ, **LITELLM_ENV}
            procs.append(subprocess.Popen(
                [str(python), "-m", "litellm.proxy.proxy_cli", "--config", str(workdir / "litellm.yaml"),
                 "--host", "127.0.0.1", "--port", str(litellm_port), "--num_workers", "1"], env=env, **quiet))
            litellm = f"http://127.0.0.1:{litellm_port}"
            wait_http(f"{litellm}/health/liveliness", procs[-1], 180)
            targets["litellm"] = (f"{litellm}/v1/chat/completions", {"authorization": f"Bearer {LITELLM_KEY}"})
            proxies["litellm"] = procs[-1]

        memory = {name: {"start_mib": rss_mib(proc)} for name, proc in proxies.items()}

        runs: dict[tuple, list[dict]] = {}
        for round_ in range(args.rounds):
            for stream in (False, True):
                body = json.dumps({**PAYLOAD, "stream": stream}).encode()
                for concurrency in concurrencies:
                    for name, (url, headers) in targets.items():
                        cell = asyncio.run(load(url, headers, body, stream, concurrency, args.seconds,
                                                args.max_requests))
                        runs.setdefault((name, stream, concurrency), []).append(cell)
                        print(f"  round {round_ + 1} {name:8s} stream={stream!s:5s} c={concurrency:<3d} "
                              f"{cell['rps']:8.0f} req/s p50 {cell['p50_ms']:7.2f} ms  p99 {cell['p99_ms']:7.2f} ms"
                              f"  errors {cell['errors']}", flush=True)
        # Medians over rounds: the targets are measured side by side in every round, so drifts in the
        # machine's background load hit them alike and the median drops the odd disturbed round.
        results = [
            {"target": name, "stream": stream, "concurrency": c, "rounds": len(cells),
             "requests": sum(x["requests"] for x in cells), "errors": sum(x["errors"] for x in cells),
             **{k: statistics.median(x[k] for x in cells) for k in ("rps", "p50_ms", "p99_ms")}}
            for (name, stream, c), cells in runs.items()
        ]
        for name, proc in proxies.items():
            memory[name]["end_mib"] = rss_mib(proc)
            memory[name]["requests"] = sum(c["requests"] for c in results if c["target"] == name)
            print(f"  {name} resident memory: {memory[name]['start_mib']:.0f} MiB idle, "
                  f"{memory[name]['end_mib']:.0f} MiB after {memory[name]['requests']} requests")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    summary = report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cells": results, "summary": summary, "memory": memory}, indent=2))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def report(results: list[dict]) -> dict:
    by = {(r["target"], r["stream"], r["concurrency"]): r for r in results}
    summary: dict = {}
    print("\nadded latency over direct (ms) and throughput")
    print(f"{'mode':7s} {'c':>3s} | {'target':8s} {'add p50':>8s} {'add p99':>8s} {'req/s':>8s} {'vs litellm':>10s}")
    for (target, stream, c), cell in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        if target == "direct":
            continue
        direct = by[("direct", stream, c)]
        add50, add99 = cell["p50_ms"] - direct["p50_ms"], cell["p99_ms"] - direct["p99_ms"]
        other = by.get(("litellm", stream, c))
        ratio = cell["rps"] / other["rps"] if other and target == "sluice" else None
        mode = "stream" if stream else "json"
        summary[f"{target}/{mode}/c{c}"] = {"added_p50_ms": add50, "added_p99_ms": add99, "rps": cell["rps"],
                                            "rps_vs_litellm": ratio}
        print(f"{mode:7s} {c:3d} | {target:8s} {add50:8.3f} {add99:8.3f} {cell['rps']:8.0f} "
              f"{'' if ratio is None else f'{ratio:9.1f}x':>10s}")
    return summary


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, stream in zip(axes, (False, True)):
        targets = sorted({r["target"] for r in results})
        concurrencies = sorted({r["concurrency"] for r in results})
        width = 0.8 / len(targets)
        for i, target in enumerate(targets):
            rps = [next(r["rps"] for r in results if r["target"] == target and r["stream"] == stream
                        and r["concurrency"] == c) for c in concurrencies]
            ax.bar([x + i * width for x in range(len(concurrencies))], rps, width, label=target)
        ax.set_xticks([x + width * (len(targets) - 1) / 2 for x in range(len(concurrencies))])
        ax.set_xticklabels([f"c={c}" for c in concurrencies])
        ax.set_ylabel("requests/s")
        ax.set_title("streaming" if stream else "non-streaming")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
