"""Builds the operator image and the runtime image (CPU variant) here, with buildah, from the local base.

    python -m images.build [operator] [runtime] [runtime-gpu] [--force] [--clean]

Names and tags are the chart's defaults (ghcr.io/sluice-dev/sluice-operator:VERSION,
ghcr.io/sluice-dev/sluice-runtime:VERSION; the GPU variant VERSION-cuda), VERSION being pyproject's.
An image whose sources have not changed since it was built is kept (its label holds their digest).
The host's pip cache is mounted into the build, so the downloads of `make install` are reused, and the
host's CA bundle, so pip trusts what the host trusts. Prints each step's time and each image's size.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import base, buildah

REPO = Path(__file__).resolve().parents[1]
REGISTRY = "ghcr.io/sluice-dev"
# pyproject's own version (read without tomllib, which Python 3.10 lacks).
VERSION = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)
# What the Dockerfiles COPY (.dockerignore admits exactly these), hashed to tell a stale image.
SOURCES = ("pyproject.toml", "README.md", "runtime", "gateway", "operator", "contracts")
DIGEST_LABEL = "dev.sluice.source-digest"
# Where the build sees the host's pip cache and CA bundle.
PIP_CACHE_IN_BUILD = "/root/.cache/pip"
CA_IN_BUILD = "/run/sluice-build/ca-certificates.crt"
CUDA = "docker.io/nvidia/cuda:12.8.1-cudnn-{kind}-ubuntu24.04"


@dataclass(frozen=True)
class Target:
    name: str
    dockerfile: str
    image: str
    # Build arguments beyond the base image's.
    args: dict[str, str] = field(default_factory=dict)
    # None: built from the local Debian base; else the (BUILD_BASE, BASE) pair, which must be pullable.
    bases: tuple[str, str] | None = None


TARGETS = {
    "operator": Target("operator", "Dockerfile.operator", f"{REGISTRY}/sluice-operator:{VERSION}"),
    "runtime": Target("runtime", "Dockerfile.runtime", f"{REGISTRY}/sluice-runtime:{VERSION}"),
    # Same Dockerfile and steps; the CUDA bases, the gpu extra and flash-attn. Needs a registry with nvidia/cuda.
    "runtime-gpu": Target("runtime-gpu", "Dockerfile.runtime", f"{REGISTRY}/sluice-runtime:{VERSION}-cuda",
                          {"EXTRAS": "engine,gpu", "FLASH_ATTN_VERSION": "2.8.3"},
                          (CUDA.format(kind="devel"), CUDA.format(kind="runtime"))),
}
LOCAL_TARGETS = ("operator", "runtime")


def source_digest(dockerfile: str) -> str:
    digest = hashlib.sha256((REPO / dockerfile).read_bytes())
    for name in SOURCES:
        path = REPO / name
        files = [path] if path.is_file() else sorted(
            p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p))
        for file in files:
            digest.update(str(file.relative_to(REPO)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def is_current(target: Target) -> bool:
    if not buildah.image_exists(target.image):
        return False
    labels = buildah.image_config(target.image).get("Labels") or {}
    return labels.get(DIGEST_LABEL) == source_digest(target.dockerfile)


def host_pip_cache() -> Path:
    """The cache `make install`'s pip filled (PIP_CACHE_DIR, else pip's default), created if absent."""
    path = Path(os.environ.get("PIP_CACHE_DIR") or Path.home() / ".cache" / "pip")
    path.mkdir(parents=True, exist_ok=True)
    return path


def host_ca_bundle() -> Path | None:
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def bud_command(target: Target, base_image: str) -> list[str]:
    build_base, final_base = target.bases or (base_image, base_image)
    args = {"BUILD_BASE": build_base, "BASE": final_base, "PIP_CACHE_OPTION": f"--cache-dir={PIP_CACHE_IN_BUILD}", **target.args}
    # HEALTHCHECK exists only in Docker's image format (Kubernetes and every registry take it).
    command = ["bud", "--format", "docker", "--isolation", "chroot", "--network", "host", "--layers=false",
               "--pull=never" if target.bases is None else "--pull=missing",
               "-f", target.dockerfile, "-t", target.image, "--label", f"{DIGEST_LABEL}={source_digest(target.dockerfile)}",
               "--volume", f"{host_pip_cache()}:{PIP_CACHE_IN_BUILD}"]
    ca = host_ca_bundle()
    if ca is not None:
        command += ["--volume", f"{ca}:{CA_IN_BUILD}:ro"]
        args["PIP_CERT"] = CA_IN_BUILD
    declared = set(re.findall(r"^ARG (\w+)", (REPO / target.dockerfile).read_text(), re.MULTILINE))
    for name, value in args.items():
        if name in declared:
            command += ["--build-arg", f"{name}={value}"]
    return [*command, str(REPO)]


def build(target: Target, force: bool = False) -> float:
    """Builds `target` unless current; returns the seconds it took (0 when kept)."""
    if not force and is_current(target):
        print(f"images: {target.image} is current", flush=True)
        return 0.0
    started = time.monotonic()
    base_image = base.ensure() if target.bases is None else ""
    buildah.buildah(*bud_command(target, base_image), stdout=sys.stderr)
    # Leftovers of the build stage (a full copy of its rootfs each under vfs).
    buildah.buildah("rmi", "--prune", check=False, capture=True)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m images.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", default=list(LOCAL_TARGETS), metavar="TARGET",
                        help=f"{', '.join(TARGETS)} (default: {' '.join(LOCAL_TARGETS)})")
    parser.add_argument("--force", action="store_true", help="rebuild even when the sources have not changed")
    parser.add_argument("--clean", action="store_true", help=f"remove every image and the base ({buildah.HOME}) and stop")
    options = parser.parse_args(argv)
    unknown = [name for name in options.targets if name not in TARGETS]
    if unknown:
        parser.error(f"unknown target {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
    try:
        if options.clean:
            buildah.clean()
            return 0
        started = time.monotonic()
        if not buildah.image_exists(base.IMAGE) and any(TARGETS[t].bases is None for t in options.targets):
            base.ensure()
            print(f"images: base {base.IMAGE} made in {time.monotonic() - started:.0f} s", flush=True)
        for name in options.targets:
            seconds = build(TARGETS[name], options.force)
            size = buildah.image_size(TARGETS[name].image)
            print(f"images: {TARGETS[name].image}: {size}, built in {seconds:.0f} s", flush=True)
    except buildah.BuildahMissing as error:
        print(f"images: {error}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        print(f"images: {' '.join(error.cmd[:4])} … failed with exit status {error.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
