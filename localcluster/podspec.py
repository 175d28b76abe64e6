"""Turns a pod's container spec into what a local process needs: argv, environment and working directory.

Follows the kubelet's rules where they apply to a process: `$(VAR)` references in env values, command
and args; downward-API fieldRefs; ConfigMap/Secret keys; a bare executable name is looked up in the
launcher's venv first (so `sluice-runtime` works), then on PATH; the pod's loopback address is its own.
"""
from __future__ import annotations

import base64
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from localcluster.engine_stand_in import stand_in_command

# Reads a ConfigMap or Secret as a dict: (kind, namespace, name) -> data, or None if it does not exist.
ObjectReader = Callable[[str, str, str], "dict[str, str] | None"]


class ContainerConfigError(ValueError):
    """The container cannot be started as specified; surfaces as CreateContainerConfigError on the pod."""


@dataclass(frozen=True)
class Mount:
    """A container's volume mount and the local directory standing in for its mount path."""

    path: str
    local: Path


def remap(text: str, mounts: list[Mount]) -> str:
    """Mount paths at the start of `text` or after `=` or `:` in it become their local directories.

    One pass, longest path first, so a replacement is never itself taken for a mount path."""
    if not mounts:
        return text
    local = {mount.path: str(mount.local) for mount in mounts}
    paths = "|".join(re.escape(path) for path in sorted(local, key=len, reverse=True))
    return re.sub(rf"(^|[=:])({paths})(?=$|[/:])", lambda match: match.group(1) + local[match.group(2)], text)


def remap_contents(content: bytes, mounts: list[Mount]) -> bytes:
    """Mount paths inside a text file (a config file naming another mounted file, as in
    `upstream_credential_file: /var/run/x/key`) become their local directories too: after the start of a line,
    a space, a quote, `=` or `:`. Files that are not UTF-8 text are left as they are."""
    if not mounts:
        return content
    try:
        text = content.decode()
    except UnicodeDecodeError:
        return content
    local = {mount.path: str(mount.local) for mount in mounts}
    paths = "|".join(re.escape(path) for path in sorted(local, key=len, reverse=True))
    remapped = re.sub(rf"(^|[\s\"'=:])({paths})(?=$|[/\s\"':])", lambda m: m.group(1) + local[m.group(2)], text,
                      flags=re.MULTILINE)
    return remapped.encode()


@dataclass
class ProcessSpec:
    container: str
    argv: list[str]
    env: dict[str, str]
    cwd: str


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, variables: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: unknown references stay as written, `$$` escapes a dollar."""

    def substitute(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return variables.get(match.group(1), match.group(0))

    return _REFERENCE.sub(substitute, text)


def field_value(pod: dict, path: str) -> str:
    metadata, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": metadata.get("name"),
        "metadata.namespace": metadata.get("namespace"),
        "metadata.uid": metadata.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return simple[path] or ""
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if keyed:
        return (metadata.get(keyed.group(1)) or {}).get(keyed.group(2), "")
    raise ContainerConfigError(f"fieldRef {path!r} is not supported by the local launcher")


def _key_ref(ref: dict, kind: str, namespace: str, read: ObjectReader) -> str | None:
    data = read(kind, namespace, ref["name"])
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        raise ContainerConfigError(f"{kind} {namespace}/{ref['name']} has no key {ref['key']!r}")
    return data[ref["key"]]


def _env_source(source: dict, namespace: str, read: ObjectReader) -> dict[str, str]:
    kind, ref = ("ConfigMap", source["configMapRef"]) if "configMapRef" in source else ("Secret", source["secretRef"])
    data = read(kind, namespace, ref["name"])
    if data is None:
        if ref.get("optional"):
            return {}
        raise ContainerConfigError(f"{kind} {namespace}/{ref['name']} not found")
    prefix = source.get("prefix", "")
    return {prefix + key: value for key, value in data.items()}


def container_env(pod: dict, container: dict, read: ObjectReader) -> dict[str, str]:
    """The variables the pod spec defines for this container, in the kubelet's order of precedence."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        env.update(_env_source(source, namespace, read))
    for item in container.get("env") or []:
        source = item.get("valueFrom")
        if source is None:
            env[item["name"]] = expand(item.get("value", ""), env)
        elif "fieldRef" in source:
            env[item["name"]] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind = "ConfigMap" if "configMapKeyRef" in source else "Secret"
            value = _key_ref(source.get("configMapKeyRef") or source["secretKeyRef"], kind, namespace, read)
            if value is not None:
                env[item["name"]] = value
        else:
            raise ContainerConfigError(f"env {item['name']}: only value, fieldRef, configMapKeyRef and secretKeyRef are supported")
    return env


def resolve_executable(name: str, cwd: str, venv_bin: Path, path: str) -> str:
    if os.path.isabs(name):
        resolved = name
    elif "/" in name:
        resolved = os.path.join(cwd, name)
    else:
        candidate = venv_bin / name
        resolved = str(candidate) if candidate.is_file() else shutil.which(name, path=path)
    if not resolved or not os.access(resolved, os.X_OK):
        raise ContainerConfigError(f"executable {name!r} not found in {venv_bin} or on PATH")
    return resolved


def process_spec(
    pod: dict, container: dict, read: ObjectReader, venv_bin: Path, base_env: dict[str, str],
    mounts: list[Mount] = (), kubeconfig: str | None = None, pinned_env: dict[str, str] | None = None,
) -> ProcessSpec:
    """`kubeconfig`: the pod's service-account credentials, where its spec mounts them; `pinned_env`: set
    after the pod's own variables (see Launcher.pinned_env)."""
    # An image that cannot run here (vLLM's) is run by its stand-in, which reads the same args.
    command = stand_in_command(container.get("image") or "") or list(container.get("command") or [])
    if not command:
        raise ContainerConfigError(
            f"container {container['name']!r} has no command; the local launcher cannot run an image's entrypoint"
        )
    defined = container_env(pod, container, read)
    env = dict(base_env)
    # The launcher's own credentials are the cluster admin's: a pod gets only its service account's.
    env.pop("KUBECONFIG", None)
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    env["PATH"] = f"{venv_bin}{os.pathsep}{base_env.get('PATH', '')}"
    env["HOSTNAME"] = pod["metadata"]["name"]
    pod_ip = (pod.get("status") or {}).get("podIP") or "127.0.0.1"
    env.update({name: own_loopback(remap(value, mounts), pod_ip) for name, value in defined.items()})
    env.update(pinned_env or {})
    argv = [own_loopback(remap(expand(part, defined), mounts), pod_ip)
            for part in command + list(container.get("args") or [])]
    cwd = remap(container.get("workingDir") or "", mounts) or os.getcwd()
    argv[0] = resolve_executable(argv[0], cwd, venv_bin, env["PATH"])
    return ProcessSpec(container=container["name"], argv=argv, env=env, cwd=cwd)


# Every container of a pod on a real node shares the pod's network namespace, whose loopback is the pod's own
# (an engine behind its guard listens there). Launched pods all share the host's loopback, so a pod's own address
# stands in for it: two pods' engines on one loopback port would otherwise collide.
_LOOPBACK = re.compile(r"(?<![0-9.])127\.0\.0\.1(?![0-9])")


def own_loopback(text: str, pod_ip: str) -> str:
    return _LOOPBACK.sub(pod_ip, text)


def decode_secret(data: dict[str, str] | None) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in (data or {}).items()}
