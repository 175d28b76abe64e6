"""A launched pod's volumes, materialised in a directory of its own, and the paths its processes see them at.

A local process has no mount namespace, so a container's `mountPath` cannot appear where the pod spec puts
it. Each volume is written to `<pod dir>/<volume name>` instead, and a reference to a mount path at the
start of an argument, an env value or after `=`/`:` in one (`--config=/etc/app/app.yaml`) is rewritten
to the local directory. ConfigMap and Secret contents are written the way the kubelet writes them: the
files are symlinks into a `..data` link that is swapped atomically, so a reader never sees half an
update, and they are refreshed when the object changes (within a second; the kubelet takes up to a
minute). Mount paths inside their text files are rewritten too (podspec.remap_contents).

Supported: emptyDir, configMap, secret, and projected volumes of those plus serviceAccountToken and
downwardAPI (what the ServiceAccount admission plugin injects as `kube-api-access-*`). Others are a
config error.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from localcluster.podspec import ContainerConfigError, Mount, ObjectReader, field_value, remap_contents

# (namespace, service account, pod name, pod uid, audience or None, expiration seconds) -> token
TokenIssuer = Callable[[str, str, str, str, "str | None", int], str]
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DATA_LINK = "..data"


@dataclass
class PodVolumes:
    """Writes one pod's volumes under `root` and keeps the ConfigMap- and Secret-backed ones current."""

    root: Path
    pod: dict
    read: ObjectReader
    issue_token: TokenIssuer
    _payloads: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def _volumes(self) -> dict[str, dict]:
        return {volume["name"]: volume for volume in self.pod["spec"].get("volumes") or []}

    def setup(self) -> None:
        """Writes every volume; raises ContainerConfigError for a missing object or an unsupported kind."""
        for name, volume in self._volumes().items():
            directory = self.root / name
            if "emptyDir" in volume:
                directory.mkdir(parents=True, exist_ok=True)
            else:
                self._write(name, self._payload(volume))

    def refresh(self) -> None:
        """Rewrites ConfigMap and Secret volumes whose object changed; a vanished optional one empties."""
        for name, volume in self._volumes().items():
            if "configMap" in volume or "secret" in volume:
                try:
                    self._write(name, self._payload(volume))
                except ContainerConfigError:
                    pass  # like the kubelet: a running container keeps the files it has

    def _pod_mounts(self) -> list[Mount]:
        """Every container's mounts, for the paths inside the volumes' own files."""
        found: dict[str, Path] = {}
        for container in self.pod["spec"].get("containers") or []:
            for mount in container.get("volumeMounts") or []:
                local = self.root / mount["name"] / mount.get("subPath", "")
                found.setdefault(mount["mountPath"].rstrip("/") or "/", local)
        return [Mount(path, local) for path, local in found.items()]

    def mounts(self, container: dict) -> list[Mount]:
        volumes = self._volumes()
        found = []
        for mount in container.get("volumeMounts") or []:
            if mount["name"] not in volumes:
                raise ContainerConfigError(f"volumeMount {mount['mountPath']!r} names no volume {mount['name']!r}")
            local = self.root / mount["name"]
            if mount.get("subPath"):
                local = local / mount["subPath"]
            found.append(Mount(mount["mountPath"].rstrip("/") or "/", local))
        return found

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _payload(self, volume: dict) -> dict[str, bytes]:
        namespace = self.pod["metadata"]["namespace"]
        if "configMap" in volume:
            return _object_files("ConfigMap", volume["configMap"], volume["configMap"]["name"], namespace, self.read)
        if "secret" in volume:
            return _object_files("Secret", volume["secret"], volume["secret"]["secretName"], namespace, self.read)
        if "projected" in volume:
            files: dict[str, bytes] = {}
            for source in volume["projected"].get("sources") or []:
                files.update(self._projected(source, namespace))
            return files
        if "downwardAPI" in volume:
            return self._downward(volume["downwardAPI"].get("items") or [])
        kind = next(iter(k for k in volume if k != "name"), "?")
        raise ContainerConfigError(f"volume {volume['name']!r}: {kind} volumes are not supported by the local launcher")

    def _projected(self, source: dict, namespace: str) -> dict[str, bytes]:
        if "configMap" in source:
            return _object_files("ConfigMap", source["configMap"], source["configMap"]["name"], namespace, self.read)
        if "secret" in source:
            return _object_files("Secret", source["secret"], source["secret"]["name"], namespace, self.read)
        if "downwardAPI" in source:
            return self._downward(source["downwardAPI"].get("items") or [])
        if "serviceAccountToken" in source:
            spec = source["serviceAccountToken"]
            meta = self.pod["metadata"]
            token = self.issue_token(
                namespace, self.pod["spec"].get("serviceAccountName") or "default", meta["name"], meta["uid"],
                spec.get("audience"), spec.get("expirationSeconds", 3600),
            )
            return {spec["path"]: token.encode()}
        raise ContainerConfigError(f"projected source {sorted(source)} is not supported by the local launcher")

    def _downward(self, items: list[dict]) -> dict[str, bytes]:
        files = {}
        for item in items:
            if "fieldRef" not in item:
                raise ContainerConfigError("downwardAPI volumes support only fieldRef items here")
            files[item["path"]] = field_value(self.pod, item["fieldRef"]["fieldPath"]).encode()
        return files

    def _write(self, name: str, payload: dict[str, bytes]) -> None:
        """The kubelet's atomic writer: a fresh timestamped directory, then one rename of the `..data` link."""
        mounts = self._pod_mounts()
        payload = {path: remap_contents(content, mounts) for path, content in payload.items()}
        if self._payloads.get(name) == payload:
            return
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
        stamp.mkdir()
        for path, content in payload.items():
            target = stamp / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        temporary = directory / "..data_tmp"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(stamp.name)
        os.replace(temporary, directory / DATA_LINK)
        visible = {path.split("/", 1)[0] for path in payload}
        for entry in visible:
            link = directory / entry
            if not link.is_symlink():
                link.symlink_to(f"{DATA_LINK}/{entry}")
        for entry in directory.iterdir():
            stale = entry.name not in (DATA_LINK, stamp.name) if entry.name.startswith("..") else entry.name not in visible
            if not stale:
                continue
            if entry.is_symlink() or not entry.is_dir():
                entry.unlink()
            else:
                shutil.rmtree(entry, ignore_errors=True)
        self._payloads[name] = payload


def _object_files(kind: str, source: dict, name: str, namespace: str, read: ObjectReader) -> dict[str, bytes]:
    data = read(kind, namespace, name)
    if data is None:
        if source.get("optional"):
            return {}
        raise ContainerConfigError(f"{kind} {namespace}/{name} not found (needed by a volume)")
    items = source.get("items")
    if not items:
        return {key: value.encode() for key, value in data.items()}
    files = {}
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise ContainerConfigError(f"{kind} {namespace}/{name} has no key {item['key']!r} (needed by a volume)")
        files[item["path"]] = data[item["key"]].encode()
    return files


def service_account_kubeconfig(mounts: list[Mount], cluster: dict, namespace: str, path: Path) -> str | None:
    """The credentials in-cluster config would read from the service-account mount, as a kubeconfig for the
    launcher's API server (a process here cannot reach the `kubernetes` Service or the fixed mount path)."""
    local = next((m.local for m in mounts if m.path == SERVICE_ACCOUNT_DIR), None)
    if local is None or not (local / "token").is_file():
        return None
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": "service-account", "user": {"tokenFile": str(local / "token")}}],
        "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": "service-account", "namespace": namespace}}],
    }))
    return str(path)
