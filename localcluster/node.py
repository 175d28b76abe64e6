"""What a launched pod's runner gets from its launcher: the API calls a kubelet makes for one pod, and where
the pod's processes, logs and volumes live on this host."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from localcluster import podspec


@dataclass(frozen=True)
class Node:
    core: client.CoreV1Api  # reports the pod's status and events, removes a deleted pod
    cluster: dict  # the API server (address and CA) the pods' service-account kubeconfigs point at
    venv_bin: Path  # where a container's command (`sluice-runtime`, ...) is looked up first
    log_dir: Path
    volume_dir: Path
    # Set in every process after the pod's own env (see Launcher.pinned_env).
    pinned_env: dict[str, str]
    log: Callable[[str], None]

    def read_object(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's or Secret's data (Secrets decoded), or None when there is none."""
        try:
            if kind == "ConfigMap":
                return self.core.read_namespaced_config_map(name, namespace).data or {}
            return podspec.decode_secret(self.core.read_namespaced_secret(name, namespace).data)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def issue_token(self, namespace: str, account: str, pod: str, uid: str, audience: str | None, seconds: int) -> str:
        """A TokenRequest bound to the pod, as the kubelet makes for a projected serviceAccountToken."""
        spec = {"expirationSeconds": seconds, "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}}
        if audience:
            spec["audiences"] = [audience]
        try:
            response = self.core.create_namespaced_service_account_token(account, namespace, {"spec": spec})
        except ApiException as error:
            raise podspec.ContainerConfigError(f"no token for service account {namespace}/{account}: {error.reason}") from None
        return response.status.token
