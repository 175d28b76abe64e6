"""Runs a built image's command the way the chart's and the operator's pods do, without a container engine.

`buildah run` cannot start from a read-only root (it writes /etc/hosts into the rootfs first), so this is
the kubelet's part done by hand, as root: a private mount (and PID) namespace via `unshare`, the image's
root bind-mounted read-only, a fresh tmpfs on each writable path (the pod's emptyDirs), /proc, /dev and
/sys, then `chroot` to the image's own user (its USER, which must be numeric and not root, as
`runAsNonRoot` requires) with the image's environment only. No network namespace: like the local pod
launcher, the process listens on the host's loopback.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from . import buildah


class NotNonRoot(Exception):
    """The image's USER is missing, not numeric, or root: runAsNonRoot would refuse to start it."""


@dataclass(frozen=True)
class ImageProcess:
    uid: int
    gid: int
    env: dict[str, str]
    workdir: str


def image_process(config: dict) -> ImageProcess:
    user = config.get("User") or ""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or not (gid or uid).isdigit() or int(uid) == 0:
        raise NotNonRoot(f"image USER is {user!r}; runAsNonRoot needs a numeric uid other than 0")
    env = dict(entry.split("=", 1) for entry in config.get("Env") or [])
    return ImageProcess(int(uid), int(gid or uid), env, config.get("WorkingDir") or "/")


@contextmanager
def mounted(image: str) -> Iterator[Path]:
    """A working container of `image` and its root directory; removed afterwards."""
    container = buildah.output("from", "--pull=never", image)
    try:
        yield Path(buildah.output("mount", container))
    finally:
        buildah.buildah("rm", container, check=False, capture=True)


def _script(root: Path, process: ImageProcess, writable: Sequence[str], command: Sequence[str]) -> str:
    """The shell run inside the new namespaces: mounts, then exec of the command as the image's user."""
    q = shlex.quote
    view = f"/run/sluice-pod-{root.name[:12]}"
    lines = ["set -e", f"mkdir -p {view}", f"mount --bind {q(str(root))} {view}",
             f"mount -o remount,bind,ro {view}",
             f"mount -t proc proc {view}/proc", f"mount --rbind /dev {view}/dev", f"mount --rbind -o ro /sys {view}/sys"]
    for path in writable:
        lines.append(f"mount -t tmpfs -o mode=0755,uid={process.uid},gid={process.gid} tmpfs {view}{q(path)}")
    env = [f"{q(k)}={q(v)}" for k, v in process.env.items()]
    inner = f"cd {q(process.workdir)} && exec env -i {' '.join(env)} {' '.join(q(c) for c in command)}"
    lines.append(f"exec chroot --userspec={process.uid}:{process.gid} --groups= {view} /bin/sh -c {q(inner)}")
    return "\n".join(lines)


def start(root: Path, config: dict, writable: Sequence[str], command: Sequence[str] | None = None,
          **popen) -> subprocess.Popen:
    """Starts `command` (default: the image's ENTRYPOINT + CMD) from `root`, read-only but for `writable`."""
    if shutil.which("unshare") is None:
        raise FileNotFoundError("unshare (util-linux) is needed to run an image read-only")
    process = image_process(config)
    argv = list(command) if command is not None else [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    script = _script(root, process, writable, argv)
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
                             "sh", "-c", script], **popen)


def stop(launcher: subprocess.Popen, timeout: float = 60) -> int:
    """SIGTERM to the image's process, as the kubelet stops a pod; SIGKILL after `timeout`.

    The signals go to unshare's child, PID 1 of the namespace (all else in it dies with it): unshare ignores
    SIGTERM while it waits, and its child no longer shares its fate once chroot has changed the user."""
    children: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        children = [int(pid) for pid in
                    Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        try:
            return launcher.wait(timeout)
        except subprocess.TimeoutExpired:
            continue
    launcher.kill()
    return launcher.wait()


def run(root: Path, config: dict, writable: Sequence[str], command: Sequence[str], timeout: float = 300
        ) -> subprocess.CompletedProcess:
    child = start(root, config, writable, command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            stop(child, timeout=5)
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
