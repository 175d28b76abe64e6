"""The local Debian base image: debootstrap's minimal bookworm, committed as a one-layer image.

No registry is reachable on CI machines, so the official debian:bookworm-slim cannot be pulled; the same
release made from Debian's own mirror stands in for it (the Dockerfiles take their base as a build argument).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from . import buildah

IMAGE = "localhost/sluice-base:bookworm"
RELEASE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# What the image needs of the host's apt: the mirror (a snapshot or a local proxy where CI has one).
SOURCES = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]


def host_mirror() -> str:
    """The first Debian archive the host's apt uses (not its security archive)."""
    for path in SOURCES:
        if not path.is_file():
            continue
        for url in re.findall(r"(?:URIs:|^deb)\s+(?:\[[^\]]*\]\s+)?(\S+)", path.read_text(), re.MULTILINE):
            if "security" not in url:
                return url
    return DEFAULT_MIRROR


def ensure() -> str:
    """The base image's name; built once, reused until `python -m images.build --clean`."""
    if buildah.image_exists(IMAGE):
        return IMAGE
    if shutil.which("debootstrap") is None:
        raise buildah.BuildahMissing(f"debootstrap is not installed; on Debian or Ubuntu: {buildah.INSTALL_HINT}")
    container = buildah.output("from", "scratch")
    try:
        root = Path(buildah.output("mount", container))
        # Straight into the container's root: vfs then holds the rootfs once, not a copy of a copy.
        subprocess.run(["debootstrap", "--variant=minbase", RELEASE, str(root), host_mirror()], check=True,
                       stdout=subprocess.DEVNULL)
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / leftover).glob("*"):
                if entry.is_file():
                    entry.unlink()
        buildah.buildah("umount", container, capture=True)
        buildah.buildah("commit", "--rm", "--quiet", container, IMAGE, capture=True)
    except BaseException:
        buildah.buildah("rm", container, check=False, capture=True)
        raise
    return IMAGE
