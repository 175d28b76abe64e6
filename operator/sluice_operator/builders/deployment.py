"""InferenceModel → the Deployment of its runtime pods."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sluice_contracts import engine_guard, runtime_credential

from ..crd import ENGINE_IMAGES, RUNTIME_PORT, InferenceModelSpec
from ..crd.adapters import Adapter
from ..crd.base import cpu_cores
from .adapters import (
    START_ADAPTERS_ANNOTATION,
    TEMPLATE_DIGEST_ANNOTATION,
    adapter_volumes,
    encode_start,
    lora_command,
    pinned_start,
    recorded_digest,
    template_digest,
)
from .engine_command import EngineCommand
from .model_mount import ModelMount, model_mount
from .names import GENERATION_ANNOTATION, Owner, labels, selector_labels
from .pod_security import container_security_context, pod_security_context, writable_env, writable_volumes
from .sglang_args import sglang_command
from .sluice_args import sluice_command
from .vllm_args import vllm_command

CONTAINER = "runtime"
# The engine guard forwards requests; it holds no model, so a little CPU and memory serve it.
GUARD_RESOURCES = {"requests": {"cpu": "100m", "memory": "96Mi"}, "limits": {"memory": "192Mi"}}
PROBE_PERIOD_SECONDS = 10
# Endpoint removal takes a moment to reach every gateway; the pod keeps serving until then.
PRESTOP_SLEEP_SECONDS = 5


def drain_seconds(spec: InferenceModelSpec) -> int:
    """In-flight streams get the grace period, less the preStop pause and a margin before SIGKILL."""
    return max(1, spec.rollout.termination_grace_period_seconds - PRESTOP_SLEEP_SECONDS - 5)


def _probe(path: str, period: int, failures: int, timeout: int = 3) -> dict[str, Any]:
    # By number: a guarded engine's container declares no port; its probes go through the guard's open paths.
    return {
        "httpGet": {"path": path, "port": RUNTIME_PORT},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def cpu_threads(cpu: str) -> int:
    """Intra-op threads for the runtime: torch sizes its pool by the node's cores, not the pod's CPU limit, so
    a 2-CPU pod on a 64-core node would run 64 threads and spend its quota being throttled."""
    return max(1, math.floor(cpu_cores(cpu)))


def _resources(spec: InferenceModelSpec) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    limits = {**amounts, "cpu": spec.resources.cpu_ceiling}
    if spec.resources.gpus:
        limits["nvidia.com/gpu"] = spec.resources.gpus
    return {"requests": amounts, "limits": limits}


def _credential_volume(secret: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The release's runtime credential, the whole Secret as a volume (no subPath), so a rotation reaches the
    running runtime, which reads the file again. Naming the key makes the pod wait until the Secret holds it."""
    key = runtime_credential.SECRET_KEY
    volume = {"name": "runtime-credential",
              "secret": {"secretName": secret, "items": [{"key": key, "path": key}], "defaultMode": 0o440}}
    return volume, {"name": "runtime-credential", "mountPath": runtime_credential.MOUNT_DIR, "readOnly": True}


def engine_image(spec: InferenceModelSpec, images: Mapping[str, str] | None = None) -> str:
    """The spec's image, else the release's for its engine (chart values), else the pinned default."""
    return spec.runtime.image or (images or {}).get(spec.runtime.engine) or ENGINE_IMAGES[spec.runtime.engine]


def _engine_command(name: str, spec: InferenceModelSpec, mount: ModelMount,
                    credential_secret: str | None) -> EngineCommand:
    engine = spec.runtime.engine
    if engine == "vllm":
        command = vllm_command(name, spec, mount, credential_secret is not None)
    elif engine == "sglang":
        command = sglang_command(name, spec, mount, credential_secret is not None)
    else:
        command = sluice_command(name, spec, mount, drain_seconds(spec), credential_secret)
    command.env = mount.env + command.env
    return command


def _container(spec: InferenceModelSpec, image: str, command: EngineCommand, env: list[dict[str, Any]],
               mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": command.command,
        "args": command.args,
        **({} if command.guarded else {"ports": [_serving_port()]}),
        "env": env,
        "resources": _resources(spec),
        "volumeMounts": mounts,
        "startupProbe": _probe(
            command.ready_path, PROBE_PERIOD_SECONDS,
            math.ceil(spec.runtime.startup_timeout_seconds / PROBE_PERIOD_SECONDS),
        ),
        "readinessProbe": _probe(command.ready_path, 5, 2),
        "livenessProbe": _probe(command.live_path, PROBE_PERIOD_SECONDS, 3, timeout=5),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SECONDS}}},
        "securityContext": container_security_context(),
    }


_POD_IP = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def _serving_port() -> dict[str, Any]:
    return {"name": "http", "containerPort": RUNTIME_PORT, "protocol": "TCP"}


def _guard_container(image: str, pull_policy: str, credential_mount: dict[str, Any]) -> dict[str, Any]:
    """The engine guard (sluice_contracts.engine_guard) on the serving port, in front of an engine on loopback;
    it alone mounts the runtime credential."""
    return {
        "name": engine_guard.CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": pull_policy,
        # The pod's own address, as Sluice's runtime listens: where probes and the gateway reach it.
        "command": [engine_guard.COMMAND, "--host", "$(POD_IP)", "--port", str(RUNTIME_PORT),
                    "--upstream", f"http://{engine_guard.ENGINE_HOST}:{engine_guard.ENGINE_PORT}",
                    "--credential-file", runtime_credential.MOUNT_PATH],
        "ports": [_serving_port()],
        "env": [_POD_IP],
        "resources": GUARD_RESOURCES,
        "volumeMounts": [credential_mount],
        # It keeps forwarding while the gateways drop the endpoint, as the engine keeps serving.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SECONDS}}},
        "securityContext": container_security_context(),
    }


def _pod_spec(spec: InferenceModelSpec, containers: list[dict[str, Any]],
              volumes: list[dict[str, Any]]) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "containers": containers,
        "volumes": volumes,
        "terminationGracePeriodSeconds": spec.rollout.termination_grace_period_seconds,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
    }
    if spec.resources.node_selector:
        pod_spec["nodeSelector"] = dict(spec.resources.node_selector)
    if spec.resources.tolerations:
        pod_spec["tolerations"] = [t.wire() for t in spec.resources.tolerations]
    return pod_spec


class NoGuardImage(ValueError):
    """A vLLM or SGLang pod that checks the credential needs the engine guard, whose image was not given."""


def build_deployment(owner: Owner, spec: InferenceModelSpec, credential_secret: str | None = None,
                     images: Mapping[str, str] | None = None, start: list[Adapter] | None = None,
                     guard_image: str | None = None) -> dict[str, Any]:
    """`credential_secret`: the release's runtime credential (none: the runtime checks no credential);
    `images`: the release's image per engine, where the spec names none; `start`: the adapters the pods start
    with (the spec's when None); `guard_image`: the engine guard's, for vLLM and SGLang pods with a credential."""
    start = list(spec.adapters or []) if start is None else start
    template = _pod_template(owner, spec, credential_secret, images, start, guard_image)
    metadata = owner.metadata()
    metadata["annotations"] = {GENERATION_ANNOTATION: str(owner.generation),
                               TEMPLATE_DIGEST_ANNOTATION: template_digest(template)}
    if spec.adapters is not None:
        metadata["annotations"][START_ADAPTERS_ANNOTATION] = encode_start(start)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": spec.replicas,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector_labels(owner.name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable},
            },
            "template": template,
        },
    }


def _pod_template(owner: Owner, spec: InferenceModelSpec, credential_secret: str | None,
                  images: Mapping[str, str] | None, start: list[Adapter], guard_image: str | None) -> dict[str, Any]:
    mount = model_mount(spec)
    volumes, mounts = writable_volumes(spec.runtime.cache_claim)
    volumes += mount.volumes
    mounts += mount.mounts
    claim_volumes, claim_mounts = adapter_volumes([*start, *(spec.adapters or [])])
    volumes += claim_volumes
    mounts += claim_mounts
    command = _engine_command(owner.name, spec, mount, credential_secret)
    lora_command(spec, start, command)
    sidecars = _credential(spec, command, credential_secret, guard_image, volumes, mounts)
    if spec.tensor_parallel_size > 1:
        # Tensor-parallel workers exchange activations through shared memory.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    env = [
        _POD_IP,
        *writable_env(),
        {"name": "OMP_NUM_THREADS", "value": str(cpu_threads(spec.resources.cpu_ceiling))},
        *({"name": name, "value": value} for name, value in sorted(spec.runtime.otel_env.items())),
        *command.env,
    ]
    container = _container(spec, engine_image(spec, images), command, env, mounts)
    return {
        "metadata": {
            # Ours last: a user label cannot detach the pods from their selector.
            "labels": {**spec.pod_labels, **labels(owner.name)},
            "annotations": {
                **spec.pod_annotations,
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(RUNTIME_PORT),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": _pod_spec(spec, [container, *sidecars], volumes),
    }


def _credential(spec: InferenceModelSpec, command: EngineCommand, credential_secret: str | None, guard_image: str | None,
                volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mounts the runtime credential where the pod checks it (the runtime itself, or the engine guard in front of
    vLLM and SGLang); returns the sidecars that takes."""
    if not (command.credential_file or command.guarded):
        return []
    volume, volume_mount = _credential_volume(credential_secret)
    volumes.append(volume)
    if command.credential_file:
        mounts.append(volume_mount)
        return []
    if guard_image is None:
        raise NoGuardImage(f"engine {spec.runtime.engine} checks the runtime credential through the engine "
                           f"guard, and the operator was given no --guard-image")
    return [_guard_container(guard_image, spec.runtime.image_pull_policy, volume_mount)]


def build_deployment_for(owner: Owner, spec: InferenceModelSpec, credential_secret: str | None,
                         existing: dict[str, Any] | None, images: Mapping[str, str] | None = None,
                         guard_image: str | None = None) -> dict[str, Any]:
    """The Deployment to apply over `existing`: when only the adapter list changed, the same template (pinned
    start list, no rollout: the running pods load and unload adapters through the runtime's API); else a
    template that starts with the spec's list."""
    pinned = pinned_start(existing)
    if pinned is not None and spec.adapters is not None:
        kept = build_deployment(owner, spec, credential_secret, images, start=pinned, guard_image=guard_image)
        if recorded_digest(kept) == recorded_digest(existing):
            return kept
    return build_deployment(owner, spec, credential_secret, images, guard_image=guard_image)
