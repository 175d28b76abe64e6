"""buildah with this project's storage: vfs under one folder we own, chroot isolation, the host's network.

No daemon, no registry and no overlay mounts are needed, which is what a CI machine or a container can
offer. vfs copies every layer in full, so the Dockerfiles keep their layers few and `clean()` removes the
whole folder.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

# Outside the repository: images and the base rootfs are gigabytes and never committed.
HOME = Path(os.environ.get("SLUICE_IMAGES_DIR", Path.home() / ".cache" / "sluice" / "images"))
STORAGE = HOME / "storage"
RUNROOT = HOME / "run"
INSTALL_HINT = "apt-get update && apt-get install -y buildah debootstrap"


class BuildahMissing(Exception):
    pass


def _global_flags() -> list[str]:
    return ["--root", str(STORAGE), "--runroot", str(RUNROOT), "--storage-driver", "vfs"]


def buildah(*args: str, capture: bool = False, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    binary = shutil.which("buildah")
    if binary is None:
        raise BuildahMissing(f"buildah is not installed; on Debian or Ubuntu: {INSTALL_HINT}")
    return subprocess.run([binary, *_global_flags(), *args], check=check, text=True,
                          capture_output=capture, **kwargs)


def output(*args: str) -> str:
    return buildah(*args, capture=True).stdout.strip()


def image_exists(name: str) -> bool:
    return buildah("inspect", "--type", "image", name, capture=True, check=False).returncode == 0


def image_config(name: str) -> dict:
    """The image's OCI config (User, Env, Entrypoint, Cmd, Labels, ...)."""
    return json.loads(output("inspect", "--type", "image", name))["OCIv1"]["config"]


def image_size(name: str) -> str:
    """The image's size as buildah prints it (its layers uncompressed: what a node unpacks)."""
    return json.loads(output("images", "--json", name))[0]["size"]


def clean() -> None:
    """Every image, container and base rootfs this project built here."""
    if STORAGE.exists():
        buildah("rm", "--all", check=False, capture=True)
        buildah("rmi", "--all", "--force", check=False, capture=True)
    shutil.rmtree(HOME, ignore_errors=True)
