"""The runtime serves from a read-only root filesystem: it writes only to SLUICE_CACHE_DIR and TMPDIR.

As a pod under the restricted Pod Security Standard runs it: a user id without a passwd entry, HOME and the
working directory unwritable, and an empty SLUICE_CACHE_DIR and TMPDIR (emptyDir volumes) the only places it
may write, so the embedded model is converted and the kernels are built there from nothing. Run as root, the
test drops to such a user, so file permissions hold for it, and finds anything it wrote in the
world-writable directories by the owner.
"""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from openai import OpenAI

from fixtures.runtime_server import _command, as_user, start_runtime_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

UID = 10001  # Dockerfile.runtime's user; no passwd entry here, as in a pod with an arbitrary uid
AS_ROOT = os.geteuid() == 0
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture
def sandbox():
    root = Path(tempfile.mkdtemp(prefix="sluice-read-only-"))
    root.chmod(0o755)
    dirs = {name: root / name for name in ("home", "workdir", "cache", "tmp")}
    for path in dirs.values():
        path.mkdir()
    for name in ("home", "workdir"):
        dirs[name].chmod(0o555)
    if AS_ROOT:
        for name in ("cache", "tmp"):
            os.chown(dirs[name], UID, UID)
    yield dirs
    shutil.rmtree(root)


def pod_env(dirs: dict, **overrides) -> dict:
    env = {"PATH": os.environ["PATH"], "HOME": str(dirs["home"]), "SLUICE_CACHE_DIR": str(dirs["cache"]),
           "TMPDIR": str(dirs["tmp"]), "OMP_WAIT_POLICY": "PASSIVE", "PYTHONDONTWRITEBYTECODE": "1"}
    return {**env, **overrides}


def written_elsewhere(root: Path, since: Path) -> list[str]:
    """Files the pod's user wrote since `since` was made, in the world-writable directories outside the sandbox."""
    found = subprocess.run(["find", "/tmp", "/var/tmp", "-xdev", "-user", str(UID), "-newer", str(since),
                            "-not", "-path", f"{root}*"], capture_output=True, text=True).stdout
    return found.split()


def exercise(url: str) -> None:
    """Every kind of work a request can cause: templating, sampling, grammars, tool calls, embeddings, streams."""
    with OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        user = [{"role": "user", "content": "What is the weather in Paris?"}]
        assert client.chat.completions.create(model="smollm2", messages=user, max_tokens=4).choices
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        client.chat.completions.create(model="smollm2", messages=user, max_tokens=12, response_format={
            "type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        client.chat.completions.create(model="smollm2", messages=user, max_tokens=24, tools=[WEATHER],
                                       tool_choice="required", logprobs=True, top_logprobs=2, seed=1)
        assert len(client.embeddings.create(model="smollm2", input=["a", "b"]).data) == 2
        chunks = list(client.completions.create(model="smollm2", prompt=["a", "b"], n=2, max_tokens=3,
                                                stream=True))
        assert {c.choices[0].finish_reason for c in chunks if c.choices} >= {"length"}


def test_serves_writing_only_to_the_cache_and_tmpdir(sandbox):
    started = sandbox["home"].parent / "started"
    started.touch()
    with start_runtime_server(model="smollm2", timeout=900, env=pod_env(sandbox), cwd=str(sandbox["workdir"]),
                              user=UID if AS_ROOT else None) as server:
        exercise(server.url)
        assert "Traceback" not in server.stderr()
    assert not any(sandbox["home"].iterdir()) and not any(sandbox["workdir"].iterdir())
    cache = sandbox["cache"]
    assert any((cache / "models").glob("smollm2-*/model.safetensors"))
    if shutil.which("g++"):
        assert any((cache / "kernels").glob("*.so"))
    if AS_ROOT:
        assert written_elsewhere(sandbox["home"].parent, started) == []


@pytest.mark.parametrize("variable", ["SLUICE_CACHE_DIR", "TMPDIR"])
def test_an_unwritable_cache_or_tmpdir_is_named_at_start(sandbox, variable):
    env = pod_env(sandbox, **{variable: str(sandbox["home"] / "sub")})
    done = subprocess.run(as_user(UID if AS_ROOT else None) + _command() + ["serve", "--port", "0"], env=env,
                          cwd=sandbox["workdir"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"{variable} (" in done.stderr and "is not writable" in done.stderr and "emptyDir" in done.stderr
    assert "Traceback" not in done.stderr


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="Triton compiles kernels (and caches them) only on a CUDA device")
def test_triton_kernels_compile_into_the_cache_not_home(sandbox):
    """Triton's cache defaults to ~/.triton, which a read-only HOME refuses at the first kernel."""
    with start_runtime_server("--device", "cuda", "--dtype", "bfloat16", "--attention-backend", "triton",
                              model="smollm2", timeout=900, env=pod_env(sandbox), cwd=str(sandbox["workdir"]),
                              user=UID if AS_ROOT else None) as server:
        exercise(server.url)
    assert any((sandbox["cache"] / "triton").rglob("*.json"))
    assert not any(sandbox["home"].iterdir())
