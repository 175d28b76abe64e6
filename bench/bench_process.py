"""What the benches that start servers share: a free loopback port, waiting until one answers, and a runtime
started on one."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

_SERVING = re.compile(r"sluice-runtime: serving \S+ at (http://\S+)")


def script(name: str) -> str:
    """A console script of this environment (sluice-runtime, sluice-gateway)."""
    return str(Path(sys.executable).with_name(name))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, process: subprocess.Popen, timeout: float, headers: dict | None = None) -> None:
    """Returns once GET `url` answers 2xx; exits the bench if `process` ends or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args[0]} exited with {process.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=1):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up within {timeout} s")


def start_runtime(workdir: Path, model: str, *flags: str, log_name: str = "runtime.log") -> tuple[subprocess.Popen, str]:
    """`sluice-runtime serve` of `model` as "m" on a free loopback port with `flags`, its log workdir/`log_name`;
    returns the process and its URL once it is ready."""
    log_path = workdir / log_name
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [script("sluice-runtime"), "serve", "--model", model, "--served-model-name", "m", "--host", "127.0.0.1",
             "--port", "0", *flags],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 600
    while not (match := _SERVING.search(log_path.read_text())):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the runtime did not start:\n{log_path.read_text()[-2000:]}")
        time.sleep(0.3)
    wait_http(f"{match.group(1)}/ready", process, 600)
    return process, match.group(1)
