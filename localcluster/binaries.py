"""Builds the pinned control-plane binaries with the Go toolchain, once per cache directory.

Everything lands in `<cache>/bin`; a component is rebuilt only when its pinned inputs change
(its build module's go.mod/go.sum, its version, its link flags).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

BUILD_DIR = Path(__file__).resolve().parent / "gomod"

KUBERNETES_VERSION = "v1.35.4"
KWOK_VERSION = "v0.7.0"
COREDNS_VERSION = "v1.15.0"
KUBE_ROUTER_VERSION = "v2.1.0"
HELM_VERSION = "v3.19.5"


KUBERNETES_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet",
                       "kube-proxy")


def cache_dir() -> Path:
    return Path(os.environ.get("SLUICE_CLUSTER_CACHE") or Path.home() / ".cache/sluice/cluster")


def _kubernetes_ldflags() -> str:
    # Without the version stamped in, the servers report v0.0.0-master and helm/kwokctl refuse them.
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={KUBERNETES_VERSION}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


@dataclass(frozen=True)
class Component:
    """One `go build` (in a build module of ours) or `go install pkg@version` producing `binaries`."""

    name: str
    binaries: tuple[str, ...]
    packages: tuple[str, ...]
    ldflags: str = "-s -w"
    module: str | None = None
    # Linked without libc, for an image that holds nothing but the binary.
    static: bool = False

    def fingerprint(self) -> str:
        digest = hashlib.sha256(f"{self.packages}|{self.ldflags}|{self.static}".encode())
        if self.module:
            # go.mod, go.sum (none for a module with no dependencies) and the module's own sources.
            for path in sorted((BUILD_DIR / self.module).iterdir()):
                digest.update(path.name.encode() + path.read_bytes())
        return digest.hexdigest()

    def command(self, bin_dir: Path) -> tuple[list[str], Path | None]:
        if self.module:
            target = f"{bin_dir}/" if len(self.binaries) > 1 else str(bin_dir / self.binaries[0])
            argv = ["go", "build", "-trimpath", "-ldflags", self.ldflags, "-o", target, *self.packages]
            return argv, BUILD_DIR / self.module
        return ["go", "install", "-trimpath", "-ldflags", self.ldflags, *self.packages], None


# Not part of the cluster: the tracing backend the traces tests export to (tests/fixtures/jaeger.py), built here so
# that one build step and one stamp file cover every Go program the tests run.
JAEGER = Component(name="jaeger", binaries=("jaeger",), packages=("github.com/jaegertracing/jaeger/cmd/jaeger",),
                   module="jaeger")

COMPONENTS = (
    Component(
        name="kubernetes",
        # The real node's kubelet and kube-proxy in the same build, so the packages they share compile once.
        binaries=KUBERNETES_BINARIES,
        packages=tuple(f"k8s.io/kubernetes/cmd/{name}" for name in KUBERNETES_BINARIES),
        ldflags=_kubernetes_ldflags(),
        module="kubernetes",
    ),
    Component(name="etcd", binaries=("etcd",), packages=("go.etcd.io/etcd/server/v3",), module="etcd"),
    # One `go install` for both, so their shared packages compile once.
    Component(
        name="kwok",
        binaries=("kwok", "kwokctl"),
        packages=(f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}", f"sigs.k8s.io/kwok/cmd/kwokctl@{KWOK_VERSION}"),
    ),
    Component(name="helm", binaries=("helm",), packages=(f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}",)),
    # The real node's (real_node.py): cluster DNS, the NetworkPolicy enforcer, the pod sandbox's process.
    Component(name="coredns", binaries=("coredns",), packages=(f"github.com/coredns/coredns@{COREDNS_VERSION}",),
              static=True),
    Component(name="kube-router", binaries=("kube-router",),
              packages=(f"github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@{KUBE_ROUTER_VERSION}",)),
    Component(name="pause", binaries=("pause",), packages=(".",), module="pause", static=True),
    JAEGER,
)


class BuildError(RuntimeError):
    pass


def go_binary() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    return str(fallback) if fallback.exists() else None


def _stamps_path(bin_dir: Path) -> Path:
    return bin_dir / ".built.json"


def missing_components(bin_dir: Path, components: Iterable[Component] = COMPONENTS) -> list[Component]:
    stamps_file = _stamps_path(bin_dir)
    stamps = json.loads(stamps_file.read_text()) if stamps_file.exists() else {}
    return [
        c
        for c in components
        if stamps.get(c.name) != c.fingerprint() or not all((bin_dir / b).exists() for b in c.binaries)
    ]


def build(bin_dir: Path, log: Callable[[str], None] = print,
          components: Iterable[Component] = COMPONENTS) -> dict[str, float]:
    """Builds what is missing or stale of `components` into bin_dir; returns seconds spent per component built."""
    missing = missing_components(bin_dir, components)
    if not missing:
        return {}
    go = go_binary()
    if go is None:
        raise BuildError("the Go toolchain is not installed (no `go` on PATH nor /usr/local/go/bin/go)")
    bin_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOBIN=str(bin_dir), GOTOOLCHAIN="local")
    env["PATH"] = f"{Path(go).parent}{os.pathsep}{env.get('PATH', '')}"
    timings: dict[str, float] = {}
    for component in missing:
        argv, cwd = component.command(bin_dir)
        argv[0] = go
        component_env = dict(env, CGO_ENABLED="0") if component.static else env
        log(f"cluster: building {component.name} ({', '.join(component.binaries)}) ...")
        started = time.monotonic()
        result = subprocess.run(argv, cwd=cwd, env=component_env, capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(
                f"building {component.name} failed (exit {result.returncode}): {' '.join(argv)}\n"
                f"{result.stderr[-4000:]}"
            )
        timings[component.name] = time.monotonic() - started
        log(f"cluster: built {component.name} in {timings[component.name]:.0f} s")
        stamps_file = _stamps_path(bin_dir)
        stamps = json.loads(stamps_file.read_text()) if stamps_file.exists() else {}
        stamps[component.name] = component.fingerprint()
        stamps_file.write_text(json.dumps(stamps, indent=1))
    return timings

