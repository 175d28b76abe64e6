"""The container images, built here with buildah (`python -m images.build`) and run as the cluster runs them.

Each image is started the way its pod starts it: the image's own user (10001, as runAsNonRoot and the
restricted profile need), a read-only root file system, and a fresh empty directory on each documented
writable path only (operator/sluice_operator/builders/pod_security.py for the runtime, the chart's /tmp for
the operator and the gateway). The runtime image then serves the embedded model to the official OpenAI
client from outside, and must answer as the host's own runtime does, greedy.

Tests the images `make images` built last (`make images-check` runs it first, so they match the sources);
where there is none, it is built first (about 20 minutes on 2 cores). Needs root, buildah and debootstrap (`make images-check` says how to install them).
"""
from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from fixtures.runtime_server import start_runtime_server
from images import build, buildah, pod_like
from sluice_operator.builders.pod_security import RUN_AS_USER, WRITABLE_DIRS, WRITABLE_ENV

REPO = Path(__file__).resolve().parents[2]
READY_LINE = re.compile(r"sluice-runtime: serving \S+ at (http://\S+)")
# Small limits, the same for the image and the host, so the two serve the same engine configuration.
SERVE_FLAGS = ["--max-model-len", "512", "--max-num-seqs", "4", "--kv-cache-memory", "128MiB", "--dtype", "float32"]
QUESTION = "What is the capital of France? Answer in one sentence."
# The chart mounts an emptyDir on /tmp in the operator's and the gateway's pods, and nothing else writable.
CONTROL_PLANE_WRITABLE = ["/tmp"]


def _chat(url: str) -> str:
    from openai import OpenAI

    with OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        reply = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": QUESTION}],
                                               temperature=0, max_tokens=24)
    return reply.choices[0].message.content


def _running(name: str):
    """The image of target `name` as `make images` last built it (built now if there is none), mounted; yields
    its root and its config. `make images-check` and `.ci/run` run `make images` first, which rebuilds a stale one."""
    image = build.TARGETS[name].image
    try:
        if not buildah.image_exists(image):
            build.build(build.TARGETS[name])
    except buildah.BuildahMissing as error:
        pytest.fail(str(error))
    with pod_like.mounted(image) as root:
        yield root, buildah.image_config(image)


@pytest.fixture(scope="module")
def runtime_root():
    yield from _running("runtime")


@pytest.fixture(scope="module")
def operator_root():
    yield from _running("operator")


@pytest.mark.integration
@pytest.mark.slow
def test_runtime_image_serves_the_embedded_model_as_the_host_does(runtime_root):
    root, config = runtime_root
    assert config["Entrypoint"] == ["sluice-runtime", "serve"]
    with start_runtime_server(*SERVE_FLAGS) as host:
        expected = _chat(host.url)
    with tempfile.TemporaryDirectory(prefix="sluice-image-") as logs:
        out, err = Path(logs, "stdout"), Path(logs, "stderr")
        command = [*config["Entrypoint"], "--model", "smollm2", "--host", "127.0.0.1", "--port", "0", *SERVE_FLAGS]
        with out.open("w") as stdout, err.open("w") as stderr:
            server = pod_like.start(root, config, list(WRITABLE_DIRS.values()), command, stdout=stdout, stderr=stderr)
        try:
            url = _wait_until_ready(server, out, err)
            assert _chat(url) == expected
        finally:
            pod_like.stop(server)
        # The embedded model was converted into the pod's /cache and nothing complained about a read-only path.
        assert "Read-only file system" not in err.read_text()


def _wait_until_ready(server: subprocess.Popen, out: Path, err: Path, timeout: float = 900) -> str:
    deadline = time.monotonic() + timeout
    while True:
        match = READY_LINE.search(out.read_text())
        if match and httpx.get(f"{match.group(1)}/ready", timeout=5).status_code == 200:
            return match.group(1)
        if server.poll() is not None:
            pytest.fail(f"the runtime image's server exited with {server.returncode}:\n{err.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"the runtime image's server was not ready after {timeout:.0f} s:\n{err.read_text()[-3000:]}")
        time.sleep(0.5)


# What a process of the image may write: the writable paths, and nothing else even where the permissions
# would allow it (/var/tmp is world-writable in Debian; only the read-only root stops it).
WRITE_PROBE = """id -u; id -g
for path in "$@"; do
  if touch "$path/.probe" 2>/dev/null; then echo "writable $path"; else echo "refused $path"; fi
done"""


@pytest.mark.integration
@pytest.mark.slow
def test_runtime_image_runs_as_10001_and_writes_only_to_its_volumes(runtime_root):
    root, config = runtime_root
    assert config["User"] == f"{RUN_AS_USER}:{RUN_AS_USER}"
    # Without the operator's environment the image already points every cache at the writable paths.
    env = dict(entry.split("=", 1) for entry in config["Env"])
    assert {name: env.get(name) for name in WRITABLE_ENV} == WRITABLE_ENV
    writable = list(WRITABLE_DIRS.values())
    probe = pod_like.run(root, config, writable,
                         ["/bin/sh", "-c", WRITE_PROBE, "probe", *writable, "/var/tmp", "/opt/sluice", "/"])
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split("\n") == [str(RUN_AS_USER), str(RUN_AS_USER),
                                        *(f"writable {path}" for path in writable),
                                        "refused /var/tmp", "refused /opt/sluice", "refused /", ""]


@pytest.mark.integration
@pytest.mark.slow
def test_operator_image_starts_the_operator_and_the_gateway(operator_root):
    root, config = operator_root
    assert config["User"] == f"{RUN_AS_USER}:{RUN_AS_USER}"
    assert config["Cmd"] == ["sluice-operator", "run"]
    operator = pod_like.run(root, config, CONTROL_PLANE_WRITABLE, ["sluice-operator", "--help"])
    assert operator.returncode == 0 and "run" in operator.stdout, operator.stderr
    # The gateway's whole import graph (uvicorn, redis, prometheus, the shared contracts) loads with its CLI.
    gateway = pod_like.run(root, config, CONTROL_PLANE_WRITABLE, ["sluice-gateway", "--help"])
    assert gateway.returncode == 0 and "--config" in gateway.stdout, gateway.stderr
    probe = pod_like.run(root, config, CONTROL_PLANE_WRITABLE,
                         ["/bin/sh", "-c", WRITE_PROBE, "probe", "/tmp", "/var/tmp", "/opt/sluice"])
    assert probe.stdout.split("\n")[2:] == ["writable /tmp", "refused /var/tmp", "refused /opt/sluice", ""]
    torch = pod_like.run(root, config, CONTROL_PLANE_WRITABLE, ["python3", "-c", "import torch"])
    assert torch.returncode != 0, "the control-plane image must not carry torch"


@pytest.mark.parametrize("user", ["", "root", "0", "0:0", "sluice", "sluice:10001", "-1", "10001:root", " 10001"])
def test_an_image_that_would_run_as_root_or_by_name_is_refused(user):
    """runAsNonRoot checks a numeric uid from the image; a name or root fails there, so it fails here first."""
    with pytest.raises(pod_like.NotNonRoot):
        pod_like.image_process({"User": user})


def test_the_chart_and_the_crd_default_to_the_images_the_build_makes():
    values = yaml.safe_load((REPO / "charts/sluice/values.yaml").read_text())
    chart = yaml.safe_load((REPO / "charts/sluice/Chart.yaml").read_text())
    tag = values["image"]["tag"] or chart["appVersion"]
    assert f"{values['image']['repository']}:{tag}" == build.TARGETS["operator"].image
    from sluice_operator.crd.inference_model import ENGINE_IMAGES

    # The sluice engine's image where neither the spec nor the chart names one.
    assert ENGINE_IMAGES["sluice"] == build.TARGETS["runtime"].image


def test_a_build_uses_the_local_base_and_reuses_the_hosts_pip_cache():
    command = build.bud_command(build.TARGETS["runtime"], "localhost/base")
    assert "--build-arg" in command and "BASE=localhost/base" in command and "BUILD_BASE=localhost/base" in command
    # pip caches into the mounted host cache, never into a layer.
    assert f"PIP_CACHE_OPTION=--cache-dir={build.PIP_CACHE_IN_BUILD}" in command
    assert f"{build.host_pip_cache()}:{build.PIP_CACHE_IN_BUILD}" in command
    # The operator's Dockerfile has no BUILD_BASE; passing it would be an unconsumed argument.
    assert not any(arg.startswith("BUILD_BASE=") for arg in build.bud_command(build.TARGETS["operator"], "b"))
