"""The gateway under a small flood of each kind a hostile client can send: oversized headers (before any key),
heavy bodies (a few MB of many small keys) and stalled streams (a client that stops reading). Measured in one
run against a real `sluice-gateway` on loopback: its resident memory, and another tenant's latency (p50, p99)
without a flood and during each.

The upstream is a small server of this file (a fake on purpose: it measures the gateway): it answers a plain
chat request at once and streams 4 KiB events without end to a streaming one, so a client that stops reading
soon has every buffer full. Bounded in count and time: `--seconds` per phase (default 8), a few flooding
connections. Run: `python bench/gateway_flood_bench.py [--out bench/results/gateway_flood_bench.json]`.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_process import free_port, wait_http  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FLOOD_KEY, LIGHT_KEY = "sk-bench-flood", "sk-bench-light"
_ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "bench", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}).encode()
_EVENT = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 4000}}]}).encode() + b"\n\n"
_LOAD = b'{"waiting": 0, "running": 0, "kv_cache_usage": 0.0}'


async def _upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            body = await reader.readexactly(length)
            if head.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(_LOAD), _LOAD))
            elif b'"stream":true' in body:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                while True:  # until the gateway closes the connection
                    writer.write(b"%x\r\n%s\r\n" % (len(_EVENT), _EVENT))
                    await writer.drain()
                    await asyncio.sleep(0.001)
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(_ANSWER), _ANSWER))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def _serve_upstream(port: int) -> None:
    async def main() -> None:
        server = await asyncio.start_server(_upstream, "127.0.0.1", port)
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()


def rss_mib(pid: int) -> float:
    """Resident memory of the gateway and its child processes (its body parser) together."""
    total = 0.0
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for process in (pid, *map(int, children)):
        for line in Path(f"/proc/{process}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


# -- the floods: each runs in threads until `stop` is set, counting what the gateway answered ---------------------

def flood_headers(port: int, stop: threading.Event, outcomes: list) -> None:
    """64 MiB of header lines per connection, no key."""
    line = b"x-filler: " + b"z" * 8000 + b"\r\n"
    while not stop.is_set():
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\n")
            try:
                for _ in range(8 * 1024):
                    sock.sendall(line)
                outcomes.append("all sent")
            except OSError:
                outcomes.append("cut off")


def flood_bodies(url: str, stop: threading.Event, outcomes: list) -> None:
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "x"}],
                       "metadata": {f"{i:06d}": 1 for i in range(300_000)}}).encode()
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            response = client.post(f"{url}/v1/chat/completions", content=body, headers={
                "authorization": f"Bearer {FLOOD_KEY}", "content-type": "application/json"})
            outcomes.append(response.status_code)


def flood_stalls(port: int, stop: threading.Event, outcomes: list) -> None:
    """Streams whose client reads nothing for 6 s, then tells whether the gateway had cut it off."""
    body = json.dumps({"model": "bench", "stream": True, "messages": [{"role": "user", "content": "x"}]}).encode()
    while not stop.is_set():
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\nauthorization: Bearer {FLOOD_KEY}\r\n"
                         f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
            stop.wait(6)
            outcomes.append("cut off" if _drains_to_end(sock) else "still streaming")


def _drains_to_end(sock: socket.socket) -> bool:
    """Whether what is buffered ends in the connection's close (a stream still running never ends)."""
    sock.settimeout(5)
    received = 0
    try:
        while data := sock.recv(1 << 20):
            received += len(data)
            if received > 64 << 20:
                return False
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def light_tenant(url: str, seconds: float) -> list[float]:
    """Another tenant's small requests, one at a time, for `seconds`: each one's latency."""
    times = []
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            response = client.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {LIGHT_KEY}"},
                                   json={"model": "bench", "messages": [{"role": "user", "content": "Hi"}]})
            times.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise RuntimeError(f"the light tenant got {response.status_code}: {response.text[:200]}")
    return times


def phase(name: str, gateway: subprocess.Popen, url: str, seconds: float, flood, args: tuple, workers: int) -> dict:
    stop, outcomes = threading.Event(), []
    threads = [threading.Thread(target=flood, args=(*args, stop, outcomes), daemon=True) for _ in range(workers)]
    rss = [rss_mib(gateway.pid)]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            rss.append(rss_mib(gateway.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for thread in threads:
        thread.start()
    time.sleep(1 if threads else 0)
    latencies = light_tenant(url, seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=40)
    sampling.set()
    sampler.join()
    summary = {
        "phase": name, "flood_workers": workers, "light_requests": len(latencies),
        "light_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "light_p99_ms": round(statistics.quantiles(latencies, n=100)[98] * 1000, 2),
        "gateway_rss_start_mib": round(rss[0], 1), "gateway_rss_max_mib": round(max(rss), 1),
        "flood_outcomes": _tally(outcomes),
    }
    print(json.dumps(summary))
    return summary


def _tally(outcomes: list) -> dict:
    tally: dict[str, int] = {}
    for outcome in outcomes:
        tally[str(outcome)] = tally.get(str(outcome), 0) + 1
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="the light tenant's measurement per phase")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gateway_flood_bench.json")
    args = parser.parse_args()

    upstream_port, port, metrics_port = free_port(), free_port(), free_port()
    _serve_upstream(upstream_port)
    workdir = Path(tempfile.mkdtemp(prefix="sluice-floodbench-"))
    tenants = [{"name": name, "models": ["bench"], "keys": [{"id": name, "sha256": hashlib.sha256(k.encode()).hexdigest()}]}
               for name, k in (("flood", FLOOD_KEY), ("light", LIGHT_KEY))]
    config = {"tenants": tenants, "access_log": False, "max_body_bytes": 8 * 1024 * 1024,
              "timeouts": {"client_send_s": 2}, "routing": {"poll_interval_s": 0.5, "poll_timeout_s": 10, "eject_after_failures": 100}}
    (workdir / "gateway.yaml").write_text(json.dumps(config))
    (workdir / "routes.json").write_text(json.dumps({"version": 1, "generation": 1, "routes": {"bench": {
        "backends": [{"name": "up", "servedModelName": "bench", "endpoints": [f"http://127.0.0.1:{upstream_port}"]}]}}}))
    script = Path(sys.executable).with_name("sluice-gateway")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "sluice_gateway.cli"]
    gateway = subprocess.Popen(command + ["--config", str(workdir / "gateway.yaml"), "--routes",
                                          str(workdir / "routes.json"), "--host", "127.0.0.1", "--port", str(port),
                                          "--metrics-port", str(metrics_port), "--log-level", "warning"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/ready", gateway, 60)
        light_tenant(url, 1)  # warm
        rows = [
            phase("no flood", gateway, url, args.seconds, None, (), 0),
            phase("oversized headers (64 MiB per connection, no key)", gateway, url, args.seconds, flood_headers,
                  (port,), 4),
            phase("heavy bodies (3.5 MB, 300,000 keys)", gateway, url, args.seconds, flood_bodies, (url,), 2),
            phase("stalled streams (client reads nothing)", gateway, url, args.seconds, flood_stalls, (port,), 8),
            phase("no flood, after", gateway, url, args.seconds, None, (), 0),
        ]
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
    args.out.write_text(json.dumps({"command": "python bench/gateway_flood_bench.py", "seconds": args.seconds,
                                    "client_send_s": 2, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
