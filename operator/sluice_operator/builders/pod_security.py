"""What lets a runtime pod into a namespace enforcing the `restricted` Pod Security Standard.

A fixed non-root user, no privilege, no service-account token (the runtime never calls the API server),
a read-only root file system, and an emptyDir (or the model's cache claim) for every place the runtime and its
libraries write.
"""
from __future__ import annotations

from typing import Any

# The user Dockerfile.runtime creates; numeric, so the kubelet can check runAsNonRoot without reading the image.
RUN_AS_USER = 10001
CACHE_DIR = "/cache"
TMP_DIR = "/tmp"
HOME_DIR = "/home/sluice"
# Volume name → mount path: the only writable places in the container.
WRITABLE_DIRS = {"cache": CACHE_DIR, "tmp": TMP_DIR, "home": HOME_DIR}
# Every library that writes somewhere is pointed at one of them.
WRITABLE_ENV = {
    "SLUICE_CACHE_DIR": f"{CACHE_DIR}/sluice",  # the converted embedded model, compiled kernels
    "XDG_CACHE_HOME": CACHE_DIR,
    "HF_HOME": f"{CACHE_DIR}/huggingface",  # Hub downloads
    "TMPDIR": TMP_DIR,
    "HOME": HOME_DIR,
}


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def writable_volumes(cache_claim: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the writable places: emptyDirs, the cache on `cache_claim` when one is named."""
    volumes = [{"name": name, "emptyDir": {}} if name != "cache" or cache_claim is None
               else {"name": name, "persistentVolumeClaim": {"claimName": cache_claim}} for name in WRITABLE_DIRS]
    mounts = [{"name": name, "mountPath": path} for name, path in WRITABLE_DIRS.items()]
    return volumes, mounts


def writable_env() -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in WRITABLE_ENV.items()]
