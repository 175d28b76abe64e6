"""Adapter files that try to make the runtime read without end, wait forever or read outside the adapter: each is
refused through `POST /v1/load_lora_adapter` with 400 and what is wrong, at the cost of a stat or a header, while
the runtime (a real process) keeps its memory and goes on serving; a good adapter still loads."""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from fixtures.gateway import RUNTIME_ARGS, TINY_MODEL_NAME
from fixtures.lora import build_lora
from fixtures.runtime_server import start_runtime_server

pytestmark = pytest.mark.integration

RANK = 4
GiB = 1024 ** 3
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def good_adapter(tiny_model_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("reader") / "good"
    build_lora(tiny_model_dir, path, seed=7, rank=RANK)
    return path


@pytest.fixture(scope="module")
def server(tiny_model_dir, good_adapter):
    with start_runtime_server(*RUNTIME_ARGS, "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
                              model=str(tiny_model_dir), timeout=240) as running:
        yield running


@pytest.fixture
def adapter(good_adapter) -> Path:
    """A copy of the good adapter to spoil, in a short path (a Unix socket's path has room for ~100 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="lora-"))
    shutil.copytree(good_adapter, root / "a")
    yield root / "a"
    shutil.rmtree(root)


def load(server, path: Path | str, name: str = "bad") -> httpx.Response:
    return httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)},
                      timeout=30)  # a load that waits on a FIFO fails the test here instead of hanging it


def refused(server, path: Path | str) -> str:
    """The message of the 400 that loading `path` gets; the adapter is not served after it."""
    response = load(server, path)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_lora_adapter" and error["param"] == "lora_path"
    assert "bad" not in {m["id"] for m in httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]}
    return error["message"]


def rss_mib(server) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def header_of(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def write_safetensors(path: Path, header: dict, data: bytes, *, length: int | None = None, size: int | None = None):
    """A safetensors file as written by hand: `length` overrides the header length it declares, `size` extends
    the file (sparse) to that many bytes."""
    blob = json.dumps(header).encode()
    path.write_bytes((len(blob) if length is None else length).to_bytes(8, "little") + blob + data)
    if size is not None:
        os.truncate(path, size)


def first_a(header: dict) -> str:
    return sorted(name for name in header if name.endswith("lora_A.weight"))[0]


def test_a_good_adapter_loads_and_serves(server, adapter, tiny_model_dir):
    # Links that stay inside the adapter's directory are fine, and so is a directory that is itself a link.
    (adapter / "weights").mkdir()
    (adapter / WEIGHTS).rename(adapter / "weights" / WEIGHTS)
    (adapter / WEIGHTS).symlink_to(Path("weights") / WEIGHTS)
    (adapter.parent / "linked").symlink_to(adapter.name)
    response = load(server, adapter.parent / "linked", name="good")
    assert response.status_code == 200, response.text
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "good", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert chat.status_code == 200 and chat.json()["model"] == "good"
    assert httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "good"}, timeout=30).status_code == 200


def test_a_sparse_400_mib_config_is_refused_by_its_size(server, adapter):
    os.truncate(adapter / CONFIG, 400 * 1024 * 1024)
    before, started = rss_mib(server), time.monotonic()
    message = refused(server, adapter)
    assert f"{CONFIG} is {400 * 1024 * 1024} bytes, more than the" in message
    assert time.monotonic() - started < 5 and rss_mib(server) - before < 50


@pytest.mark.parametrize("name", [CONFIG, WEIGHTS])
def test_a_fifo_is_refused_without_waiting_on_it(server, adapter, name):
    (adapter / name).unlink()
    os.mkfifo(adapter / name)
    assert f"{name} is a FIFO, not a regular file" in refused(server, adapter)


def test_a_socket_is_refused(server, adapter):
    (adapter / WEIGHTS).unlink()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(adapter / WEIGHTS))
        listener.listen()
        assert f"{WEIGHTS} is a socket, not a regular file" in refused(server, adapter)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_node_inside_the_directory_is_refused(server, adapter):
    (adapter / WEIGHTS).unlink()
    os.mknod(adapter / WEIGHTS, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
    assert f"{WEIGHTS} is a character device, not a regular file" in refused(server, adapter)


@pytest.mark.parametrize("name, target", [
    (WEIGHTS, "/dev/zero"),
    (CONFIG, "/proc/self/environ"),
    (CONFIG, "../outside/" + CONFIG),
    (WEIGHTS, "../outside/" + WEIGHTS),
])
def test_a_link_out_of_the_adapters_directory_is_refused(server, adapter, name, target):
    outside = adapter.parent / "outside"
    outside.mkdir()
    shutil.copy(adapter / name, outside / name)  # a good file, but not the adapter's
    (adapter / name).unlink()
    (adapter / name).symlink_to(target)
    before = rss_mib(server)
    message = refused(server, adapter)
    assert f"{name} is a link to " in message and "outside the adapter's directory" in message
    assert rss_mib(server) - before < 50


def test_a_declared_64_gib_tensor_in_a_sparse_file_is_refused_by_its_shape(server, adapter):
    header, data = header_of(adapter / WEIGHTS)
    name = first_a(header)
    huge = 64 * GiB // (4 * RANK)  # F32 columns of a lora_A of 64 GiB
    entry = {"dtype": "F32", "shape": [RANK, huge], "data_offsets": [0, 64 * GiB]}
    rest = {k: v for k, v in header.items() if k not in (name, "__metadata__")}
    at, kept = 0, b""
    for key, value in sorted(rest.items(), key=lambda item: item[1]["data_offsets"][0]):
        begin, end = value["data_offsets"]
        kept += data[begin:end]
        rest[key] = {**value, "data_offsets": [at, at + end - begin]}
        at += end - begin
    entry["data_offsets"] = [at, at + 64 * GiB]
    blob_header = {**rest, name: entry}
    blob = json.dumps(blob_header).encode()
    write_safetensors(adapter / WEIGHTS, blob_header, kept, size=8 + len(blob) + at + 64 * GiB)
    before, started = rss_mib(server), time.monotonic()
    message = refused(server, adapter)
    assert f"lora_A is ({RANK}, {huge})" in message and "trained for another base model" in message
    assert time.monotonic() - started < 5 and rss_mib(server) - before < 50


def test_a_second_name_for_a_weight_cannot_carry_an_unchecked_tensor(server, adapter):
    header, data = header_of(adapter / WEIGHTS)
    header.pop("__metadata__", None)
    original = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    alias = original.replace("layers.0.", "layers.00.")
    header[alias] = {"dtype": "F32", "shape": [RANK, 64 * GiB // (4 * RANK)],
                     "data_offsets": [len(data), len(data) + 64 * GiB]}
    blob = json.dumps(header).encode()
    write_safetensors(adapter / WEIGHTS, header, data, size=8 + len(blob) + len(data) + 64 * GiB)
    before, started = rss_mib(server), time.monotonic()
    message = refused(server, adapter)
    assert "layer 0 q_proj lora_A twice" in message
    assert time.monotonic() - started < 5 and rss_mib(server) - before < 50


def test_a_path_or_a_value_no_file_system_or_float_takes_is_refused(server, adapter):
    assert "is not a directory" in refused(server, f"{adapter}\x00/x")
    config = json.loads((adapter / CONFIG).read_text())
    (adapter / CONFIG).write_text(json.dumps(config)[:-1] + ', "lora_alpha": ' + "9" * 400 + "}")
    message = refused(server, adapter)
    assert "lora_alpha must be a positive number, got 9999" in message and len(message) < 300


def _retyped(header: dict, **fields) -> dict:
    name = first_a(header)
    return {**header, name: {**header[name], **fields}}


def _spoil_header(change):
    def apply(path: Path) -> None:
        header, data = header_of(path / WEIGHTS)
        write_safetensors(path / WEIGHTS, *change(header, data))
    return apply


def _declared_length(length: int):
    def apply(path: Path) -> None:
        header, data = header_of(path / WEIGHTS)
        write_safetensors(path / WEIGHTS, header, data, length=length)
    return apply


def _overlapping(header: dict, data: bytes) -> tuple[dict, bytes]:
    """Layer 1's q_proj lora_B declared over layer 0's bytes (the same shape, so each entry alone is right)."""
    first, second = (f"base_model.model.model.layers.{n}.self_attn.q_proj.lora_B.weight" for n in (0, 1))
    return {**header, second: {**header[second], "data_offsets": header[first]["data_offsets"]}}, data


def _gap(header: dict, data: bytes) -> tuple[dict, bytes]:
    return header, data + b"\0" * 64


def _huge_in_small_file(header: dict, data: bytes) -> tuple[dict, bytes]:
    name = first_a(header)
    begin = header[name]["data_offsets"][0]
    return {**header, name: {"dtype": "F32", "shape": [RANK, 4 * GiB], "data_offsets": [begin, begin + 64 * GiB]}}, data


@pytest.mark.parametrize("change, message", [
    (_declared_length(2 ** 40), "declares a header of 1099511627776 bytes, more than the"),
    (_declared_length(10 ** 9), "declares a header of 1000000000 bytes, more than the"),
    (_declared_length(3 * 1024 * 1024), "is corrupt: it declares a header of 3145728 bytes but holds"),
    (lambda p: (p / WEIGHTS).write_bytes(b"\x05\x00"), "is corrupt: it is shorter than the 8 bytes"),
    (_spoil_header(lambda h, d: ([1, 2], d)), "is corrupt: its header is not a JSON object"),
    (_spoil_header(lambda h, d: (_retyped(h, dtype="I64"), d)), "has dtype 'I64'"),
    (_spoil_header(lambda h, d: (_retyped(h, dtype=None), d)), "has dtype None"),
    (_spoil_header(lambda h, d: (_retyped(h, shape=[RANK, -1]), d)), "non-negative 64-bit integers"),
    (_spoil_header(lambda h, d: (_retyped(h, shape=[True, 2]), d)), "non-negative 64-bit integers"),
    (_spoil_header(lambda h, d: (_retyped(h, shape="4x576"), d)), "non-negative 64-bit integers"),
    (_spoil_header(lambda h, d: (_retyped(h, data_offsets=None), d)), "has data_offsets None"),
    (_spoil_header(lambda h, d: (_retyped(h, data_offsets=[8, 0]), d)), "has data_offsets [8, 0]"),
    (_spoil_header(lambda h, d: (_retyped(h, data_offsets=[0, 1.5]), d)), "has data_offsets [0, 1.5]"),
    (_spoil_header(lambda h, d: (_retyped(h, shape=[RANK, 1]), d)), "but its data_offsets span"),
    (_spoil_header(_huge_in_small_file), "which holds"),
    (_spoil_header(_overlapping), "tensors overlap or leave gaps"),
    (_spoil_header(_gap), "but the file holds"),
    (_spoil_header(lambda h, d: ({**h, "x": 5}, d)), "tensor 'x' is declared as 5"),
    (_spoil_header(lambda h, d: (_retyped(h, shape=[1] * 9), d)), "not a list of at most 8"),
    (_spoil_header(lambda h, d: (_retyped(h, shape=[2 ** 64, 1]), d)), "non-negative 64-bit integers"),
    (_spoil_header(lambda h, d: (_retyped(h, data_offsets=[0, 2 ** 64]), d)),
     "has data_offsets [0, 18446744073709551616]"),
    (_spoil_header(lambda h, d: ({**{k.replace("layers.0.", "layers." + "1" * 5000 + "."): v for k, v in h.items()}},
                                 d)), "which is not a LoRA weight"),
    (_spoil_header(lambda h, d: ({**h, "y" * 100000: 5}, d)), "tensor 'yyyy"),
    (lambda p: (p / WEIGHTS).write_bytes((200000).to_bytes(8, "little") + b"[" * 200000),
     "is corrupt: its header is not a JSON object"),
    (lambda p: (p / CONFIG).write_text("[" * 200000), f"{CONFIG} is not valid JSON"),
    (lambda p: (p / CONFIG).write_bytes(b"\xff\xfe{}"), f"{CONFIG} is not valid JSON"),
])
def test_a_safetensors_or_config_file_that_lies_is_refused_before_its_tensors_are_read(server, adapter, change,
                                                                                        message):
    change(adapter)
    refusal = refused(server, adapter)
    assert message in refusal and len(refusal) < 1024  # what an InferenceModel's status can carry


def test_the_runtime_still_serves_after_every_refusal(server, good_adapter):
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert chat.status_code == 200
    assert load(server, good_adapter, name="again").status_code == 200
