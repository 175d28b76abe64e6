"""The figure tables of bench/README.md, each from the results file its benchmark wrote.

A results file's `host` names the run's date and machine; its load average comes from the figures the benchmark
recorded, or from `host` where the benchmark did not record one.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / name).read_text())
    return data


def _averages(value: object) -> list[float]:
    """Every load average sampled inside a results file, at any depth."""
    if isinstance(value, dict):
        return [a for key, v in value.items() for a in
                (_averages(v) if key not in ("load_average", "load_average_after") else _flat(v))]
    if isinstance(value, list):
        return [a for v in value for a in _averages(v)]
    return []


def _flat(value: object) -> list[float]:
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, list):
        return [float(v) for v in value]
    return []


def _run_line(name: str, data: dict[str, Any]) -> str:
    host = data.get("host", {})
    averages = _averages(data)
    if averages:
        low, high = min(averages), max(averages)
        load = f"load average {low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"load average {low:.1f}-{high:.1f}"
    elif "load_average" in host:
        load = f"load average {host['load_average']}"
    else:
        load = "load average not recorded"
    machine = f"on {host['machine']}" if "machine" in host else "machine not recorded"
    return f"Run of {host.get('date', 'an unrecorded date')}, {machine}, {load} (`bench/results/{name}`):"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def _ratio(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"


def short_under_long() -> str:
    data = _load("engine_short_under_long.json")
    rows = ["| run | short TTFT p50 / p99 | short ITL p50 / p99 | output tok/s | steps |", "| --- | --- | --- | --- | --- |"]
    for key, row in data["rows"].items():
        label = key.replace("alone,", "chats alone,").replace("mix,", "with the long prompts,")
        rows.append(f"| {label} | {row['short_ttft_p50_s']:.1f} s / {row['short_ttft_p99_s']:.1f} s | "
                    f"{_ms(row['short_itl_p50_s'])} / {_ms(row['short_itl_p99_s'])} | {row['output_tok_s']:.1f} | "
                    f"{row['steps']} |")
    ratios = data["ratios"]
    rows += ["", "| ratio (target) | this run |", "| --- | --- |",
             f"| short TTFT p99 with the long prompts / alone, budget auto (at most 1.5) | "
             f"{_ratio(ratios['auto']['ttft_p99_mix_over_alone'])} |",
             f"| short ITL p99 / idle decode step, budget auto (at most 2) | "
             f"{_ratio(ratios['auto']['itl_p99_mix_over_idle_decode_step'])} |",
             f"| short ITL p99 / idle decode step, budget off | {_ratio(ratios['off']['itl_p99_mix_over_idle_decode_step'])} |",
             f"| mix output tok/s, budget auto / off (at least 0.9) | {_ratio(ratios['mix_throughput_on_over_off'])} |",
             "", f"Idle decode step: {_ms(ratios['idle_decode_step_s'])}; the median decode-only step over every "
             f"batch size: {_ms(ratios['decode_only_step_all_batches_p50_s'])}."]
    return "\n".join([_run_line("engine_short_under_long.json", data), "", *rows])


def throughput_mix() -> str:
    data = _load("engine.json")
    rows = ["| row | output tok/s | mean TTFT | mean ITL |", "| --- | --- | --- | --- |"]
    for key, row in data["rows"].items():
        rows.append(f"| {key} | {row['output_tok_s']:.1f} | {row['mean_ttft_s']:.1f} s | {_ms(row['mean_itl_s'])} |")
    tok_s = {key: row["output_tok_s"] for key, row in data["rows"].items()}
    auto, off = tok_s.get("sluice c=32, budget auto"), tok_s.get("sluice c=32, budget off")
    lines = [_run_line("engine.json", data), "", *rows, "",
             f"A 1,024-square {data['dtype']} matmul ran at {data['matmul_gflops']:.0f} GFLOP/s in this run, a "
             f"roofline of {data['roofline_output_tok_s']:.1f} output tok/s for this mix."]
    if auto and off:
        lines.append(f"Budget auto / off: {auto / off:.2f}.")
        batch = tok_s.get("transformers generate_batch")
        if batch:
            lines.append(f"Sluice / `generate_batch`: {auto / batch:.1f}x (auto), {off / batch:.1f}x (off).")
        llama = next((v for k, v in tok_s.items() if k.startswith("llama.cpp")), None)
        if llama:
            lines.append(f"Sluice (mean of its two rows) / llama.cpp's server: {(auto + off) / 2 / llama:.2f}x.")
    return "\n".join(lines)


def lora() -> str:
    data = _load("engine_lora.json")
    rows = ["| row | output tok/s |", "| --- | --- |"]
    rows += [f"| {key} | {row['output_tok_s']:.1f} |" for key, row in data["rows"].items()]
    return "\n".join([_run_line("engine_lora.json", data), "", *rows, "",
                      f"4 adapters / base: {data['adapters_over_base']:.2f} (target at least 0.7)."])


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def _requests_by_concurrency(rows: dict[str, dict[str, Any]]) -> str:
    """How many requests ran at each concurrency, from rows named "... c=N"."""
    counts = {c: row["requests"] for key, row in rows.items() if (c := key.rsplit(" c=", 1)[-1]).isdigit()}
    return ", ".join(f"{n} at c={c}" for c, n in counts.items())


def _each(prefix: str, table: Callable[[str, dict[str, Any]], str]) -> str:
    """One table per results file of a benchmark that writes one per CPU level (PREFIX-LEVEL.json)."""
    return "\n\n".join(table(path.name, _load(path.name)) for path in sorted(RESULTS.glob(f"{prefix}-*.json")))


def _quantization(name: str, data: dict[str, Any]) -> str:
    rows = ["| row | output tok/s | mean TTFT | mean ITL |", "| --- | --- | --- | --- |"]
    rows += [f"| {key} | {row['error']} | | |" if "error" in row else
             f"| {key} | {row['output_tok_s']:.1f} | {_s(row['mean_ttft_s'])} | {_ms(row['mean_itl_s'])} |"
             for key, row in data["rows"].items()]
    # The llama.cpp column only where the run had its server (--llama-cpp).
    over_llama_cpp = data.get("int8_over_llama_cpp") or {}
    columns = ["int8 / float32 output tok/s"] + (["int8 / llama.cpp server (Q4_1)"] if over_llama_cpp else [])
    rows += ["", "| concurrency | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for c, ratio in data["int8_over_float32"].items():
        cells = [_ratio(ratio)] + ([_ratio(over_llama_cpp[c]) if c in over_llama_cpp else "-"] if over_llama_cpp else [])
        rows.append(f"| {c} | " + " | ".join(cells) + " |")
    weights = data["weight_bytes"]
    resident = ", ".join(f"{dtype} {size / 2**20:,.0f} MiB" + ("" if dtype == "float32" else
                                                               f" ({size / weights['float32']:.2f} of float32)")
                         for dtype, size in weights.items())
    return "\n".join([
        _run_line(name, data), "",
        f"CPU path {data['cpu']}; int8 linears: {data['int8_linears']}; {data['torch_threads']} torch threads; "
        f"requests {_requests_by_concurrency(data['rows'])}, {data['output_len']} output tokens each:", "", *rows, "",
        f"Resident weights: {resident}."])


def quantization() -> str:
    return _each("quantization", _quantization)


def _speculative(name: str, data: dict[str, Any]) -> str:
    rows = ["| row | requests | output tokens | output tok/s | mean TTFT | mean ITL | acceptance |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for key, row in data["rows"].items():
        accepted = "-" if row["acceptance_rate"] is None else f"{row['acceptance_rate'] * 100:.0f} %"
        rows.append(f"| {key} | {row['requests']} | {row['output_tokens']:,} | {row['output_tok_s']:.1f} | "
                    f"{_s(row['mean_ttft_s'])} | {_ms(row['mean_itl_s'])} | {accepted} |")
    rows += ["", "| chats, concurrency | plain / n-gram mean ITL |", "| --- | --- |"]
    rows += [f"| {key} | {_ratio(ratio)} |" for key, ratio in data["plain_itl_over_ngram_itl"].items()]
    return "\n".join([
        _run_line(name, data), "",
        f"CPU path {data['cpu']}; `--speculative-config '{json.dumps(data['speculative_config'])}'`; "
        f"{data['torch_threads']} torch threads; at most {data['output_len']} output tokens a chat:", "", *rows])


def speculative() -> str:
    return _each("speculative", _speculative)


def embedding() -> str:
    data = _load("embedding.json")
    rows = ["| row | inputs/s (median) | per round | vs transformers, padded batch |", "| --- | --- | --- | --- |"]
    for row in data["rows"]:
        rounds = " / ".join(f"{v:.2f}" for v in row["per_round"])
        rows.append(f"| {row['row']} | {row['inputs_per_s']:.2f} | {rounds} | {row['ratio']:.2f}x |")
    cosines = ", ".join(f"{value:.6f} {how}" for how, value in data["lowest_cosine"].items())
    return "\n".join([_run_line("embedding.json", data), "", *rows, "",
                      f"Lowest cosine with transformers, per input: {cosines}."])


def gateway_overhead() -> str:
    data = _load("gateway_bench.json")
    summary = data["summary"]
    rows = ["| | added p50 at c=1 | req/s at c=1 / 16 / 64 | Sluice ÷ LiteLLM req/s |", "| --- | --- | --- | --- |"]
    for mode, label in (("json", "JSON"), ("stream", "streaming")):
        for target in ("sluice", "litellm"):
            cells = [summary[f"{target}/{mode}/c{c}"] for c in (1, 16, 64)]
            rps = " / ".join(f"{cell['rps']:.0f}" for cell in cells)
            versus = " / ".join(f"{cell['rps_vs_litellm']:.1f}x" for cell in cells) if target == "sluice" else ""
            name = "Sluice" if target == "sluice" else "LiteLLM"
            rows.append(f"| {name}, {label} | {cells[0]['added_p50_ms']:.1f} ms | {rps} | {versus} |")
    memory = "; ".join(f"{'Sluice' if who == 'sluice' else 'LiteLLM'} {m['start_mib']:.0f} → {m['end_mib']:.0f} MiB "
                       f"after {m['requests']:,} requests" for who, m in data["memory"].items())
    return "\n".join([_run_line("gateway_bench.json", data), "", *rows, "", f"Resident memory: {memory}."])


def _outcomes(outcomes: dict[str, int] | None) -> str:
    if not outcomes:
        return ""
    return ", ".join(f"{count:,} answered {what}" if what.isdigit() else f"{count:,} {what}"
                     for what, count in outcomes.items())


def gateway_floods() -> str:
    data = _load("gateway_flood_bench.json")
    rows = ["| phase | flooding workers | other tenant p50 / p99 | gateway RSS start → max | flood outcome |",
            "| --- | --- | --- | --- | --- |"]
    for row in data["rows"]:
        rows.append(f"| {row['phase']} | {row['flood_workers']} | {row['light_p50_ms']:.1f} / {row['light_p99_ms']:.1f} ms "
                    f"| {row['gateway_rss_start_mib']:.1f} → {row['gateway_rss_max_mib']:.1f} MiB | "
                    f"{_outcomes(row['flood_outcomes'])} |")
    return "\n".join([_run_line("gateway_flood_bench.json", data), "", *rows, "",
                      f"Each phase {data['seconds']:.0f} s, `client_send_s: {data['client_send_s']}`."])


_PRIORITY_MODES = {"classes": "A `batch`, B `critical`", "standard": "both `standard` (tenant fairness only)",
                   "direct": "straight to the runtime, no priority, no tenant"}


def priority() -> str:
    data = _load("priority_bench.json")
    rows = ["| mode | B TTFT p50 alone | B TTFT p50 under A's flood | ratio | A under the flood |",
            "| --- | --- | --- | --- | --- |"]
    for mode, run in data["modes"].items():
        idle, flood = run["idle"]["b_ttft_p50"], run["flood"]["b_ttft_p50"]
        rows.append(f"| {_PRIORITY_MODES.get(mode, mode)} | {idle:.2f} s | {flood:.2f} s | {_ratio(flood / idle)}x | "
                    f"{_outcomes(run['flood']['a_outcomes'])} |")
    fair, config = data["fairness"], data["config"]
    return "\n".join([_run_line("priority_bench.json", data), "", *rows, "",
                      f"Two `standard` tenants for {config['fair_seconds']:.0f} s: C completed {fair['c_completions']}, "
                      f"D {fair['d_completions']}."])


def _or_dash(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def overload() -> str:
    data = _load("overload_bench.json")
    sustained, settings = data["sustained"], data["settings"]
    budget = data["runtimes"]["on"]["budget_s"]
    rows = ["| admission | load | 200 / 503 | past the client timeout | p50 / p99 (s) | refusal p50 / max (ms) | "
            "Retry-After (s) | goodput (x sustained) | recovery |", "|---|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        refusal = ("-" if row["refusal_p50_ms"] is None
                   else f"{row['refusal_p50_ms']:.0f} / {row['refusal_max_ms']:.0f}")
        recovery = (f"none within {settings['client_timeout']:.0f} s" if row["recovery_s"] is None
                    else f"{row['recovery_s']:g} s")
        rows.append(f"| {row['admission']} | {row['load']} | {row['ok']} / {row['refused']} | {row['past_timeout']} | "
                    f"{row['admitted_p50_s']:.1f} / {row['admitted_p99_s']:.1f} | {refusal} | "
                    f"{_or_dash(row['retry_after_median_s'], 'd')} | {row['goodput_vs_sustained']:.2f} | {recovery} |")
    return "\n".join([
        _run_line("overload_bench.json", data), "",
        f"Sustained: {sustained['rate']:.2f} requests/s (closed loop, concurrency {sustained['concurrency']}), median "
        f"{sustained['median_s']:.1f} s; each client sends a budget of {budget:.1f} s and waits up to "
        f"{settings['client_timeout']:.0f} s. Arrivals for {settings['duration']:.0f} s at the loads below, in "
        "multiples of the sustained rate:", "", *rows])


def serve() -> str:
    data = _load("serve_bench.json")
    config = data["config"]
    rows = ["| round | server output tok/s | offline engine output tok/s | server TTFT p50 / p99 | server ITL p50 / p99 |",
            "| --- | --- | --- | --- | --- |"]
    for number, run in enumerate(data["rounds"], 1):
        served = run["serve"]
        rows.append(f"| {number} | {served['output_throughput']:.1f} | {run['offline']['output_throughput']:.1f} | "
                    f"{served['ttft_ms']['median']:,.0f} / {served['ttft_ms']['p99']:,.0f} ms | "
                    f"{served['itl_ms']['median']:,.0f} / {served['itl_ms']['p99']:,.0f} ms |")
    return "\n".join([
        _run_line("serve_bench.json", data), "",
        f"{config['num_prompts']} prompts of {config['input_len']} tokens, {config['output_len']} output tokens, "
        f"concurrency {config['max_concurrency']}, {config['dtype']}:", "", *rows, "",
        f"Server / offline engine, median over the rounds: {data['median_server_over_offline']:.2f}."])


def batch() -> str:
    data = _load("batch_bench.json")
    config, ttft = data["config"], data["ttft"]
    rows = ["| online chats | TTFT p50 | TTFT p99 |", "| --- | --- | --- |"]
    for case, label in (("alone", "no batch"), ("with_batch", "with the batch running")):
        rows.append(f"| {label} ({ttft[case]['chats']} chats) | {_ms(ttft[case]['ttft_p50_s'])} | "
                    f"{_ms(ttft[case]['ttft_p99_s'])} |")
    runs = ["| round | batch output tok/s (lines/s) | `LLM.generate` output tok/s (lines/s) | batch / offline | "
            "batch gateway CPU a line |", "| --- | --- | --- | --- | --- |"]
    for number, row in enumerate(data["throughput"], 1):
        batch_run, offline = row["batch"], row["offline"]
        runs.append(f"| {number} | {batch_run['output_tok_s']:.1f} ({batch_run['lines_s']:.2f}) | "
                    f"{offline['output_tok_s']:.1f} ({offline['lines_s']:.2f}) | {row['ratio']:.2f} | "
                    f"{batch_run['gateway_cpu_ms_per_line']:.2f} ms |")
    concurrency = ("the gateway's default `batch.concurrency`" if config["concurrency"] is None
                   else f"`batch.concurrency` {config['concurrency']}")
    return "\n".join([
        _run_line("batch_bench.json", data), "",
        f"Batches of {config['lines']:,} chat lines of {config['max_tokens']} output tokens, {concurrency}, the "
        f"runtime's `--max-num-seqs` {config['max_num_seqs']}, {config['dtype']}. Online: "
        f"{config['ttft_rounds']} rounds of {config['chats']} streamed chats of {config['chat_tokens']} output tokens, "
        "one at a time, with the batch and without it in turn:", "", *rows, "",
        f"TTFT with the batch / without: p50 {ttft['p50_ratio']:.2f}x, p99 {ttft['p99_ratio']:.2f}x (target within "
        "1.3x)." + (f" Steps of batch work abandoned for the chats: {ttft['steps_interrupted']:.0f} "
                    f"(of {ttft['batch_lines_done_before_cancel']:,} lines done meanwhile)."
                    if "steps_interrupted" in ttft else ""), "", *runs, "",
        f"Batch / offline `LLM.generate`, median over the rounds: {data['throughput_ratio']:.2f} (target at least "
        "0.8)."])


# The block name in bench/README.md -> its table.
TABLES: dict[str, Callable[[], str]] = {
    "bench-short-under-long": short_under_long,
    "bench-throughput-mix": throughput_mix,
    "bench-lora": lora,
    "bench-quantization": quantization,
    "bench-speculative": speculative,
    "bench-embedding": embedding,
    "bench-serve": serve,
    "bench-gateway-overhead": gateway_overhead,
    "bench-gateway-floods": gateway_floods,
    "bench-priority": priority,
    "bench-overload": overload,
    "bench-batch": batch,
}
