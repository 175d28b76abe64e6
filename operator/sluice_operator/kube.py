"""The few Kubernetes API calls the handlers make, run off the event loop (the official client is blocking)."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator

import kubernetes
from kubernetes.client.rest import ApiException

from .crd import GROUP, LABEL_MODEL, MANAGED_BY, VERSION, InferenceModel
from .crd.definitions import PEERING_GROUP
from .pods import claimed_model, replicas

FIELD_MANAGER = MANAGED_BY
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


def load_config() -> None:
    """In a pod: its service account. Elsewhere: $KUBECONFIG or ~/.kube/config."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


class Kube:
    def __init__(self) -> None:
        client = kubernetes.client.ApiClient()
        self.core = kubernetes.client.CoreV1Api(client)
        self.apps = kubernetes.client.AppsV1Api(client)
        self.policy = kubernetes.client.PolicyV1Api(client)
        self.networking = kubernetes.client.NetworkingV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self._sanitize = client.sanitize_for_serialization

    async def _call(self, fn, *args, **kwargs) -> Any:
        result = await asyncio.to_thread(fn, *args, **kwargs)
        return self._sanitize(result) if result is not None and not isinstance(result, dict) else result

    async def _call_unless(self, status: int, fn, *args, **kwargs) -> Any:
        """`_call`, with None for the one answer that means "already as wanted": 404 (gone) or 409 (exists)."""
        try:
            return await self._call(fn, *args, **kwargs)
        except ApiException as exc:
            if exc.status == status:
                return None
            raise

    async def apply(self, manifest: dict[str, Any], force: bool = True) -> dict[str, Any]:
        """Server-side apply: only the fields we set are ours, so other controllers' fields survive. `force`
        takes back fields someone else changed; without it, fields another manager set are a 409 conflict."""
        meta = manifest["metadata"]
        apply = {
            "Deployment": self.apps.patch_namespaced_deployment,
            "Service": self.core.patch_namespaced_service,
            "PodDisruptionBudget": self.policy.patch_namespaced_pod_disruption_budget,
            "ConfigMap": self.core.patch_namespaced_config_map,
            "Secret": self.core.patch_namespaced_secret,
            "NetworkPolicy": self.networking.patch_namespaced_network_policy,
        }[manifest["kind"]]
        return await self._call(
            apply, meta["name"], meta["namespace"], manifest,
            field_manager=FIELD_MANAGER, force=force, _content_type=APPLY,
        )

    async def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as it is now, or None when there is none."""
        read = {
            "Deployment": self.apps.read_namespaced_deployment,
            "Service": self.core.read_namespaced_service,
            "PodDisruptionBudget": self.policy.read_namespaced_pod_disruption_budget,
            "ConfigMap": self.core.read_namespaced_config_map,
            "Secret": self.core.read_namespaced_secret,
            "NetworkPolicy": self.networking.read_namespaced_network_policy,
        }[kind]
        return await self._call_unless(404, read, name, namespace)

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        delete = {
            "ConfigMap": self.core.delete_namespaced_config_map,
            "Secret": self.core.delete_namespaced_secret,
            "NetworkPolicy": self.networking.delete_namespaced_network_policy,
        }[kind]
        await self._call_unless(404, delete, name, namespace)

    async def patch_secret_if_unchanged(self, namespace: str, name: str, resource_version: str,
                                        patch: dict[str, Any]) -> None:
        """A merge patch that fails with 409 should the Secret have changed since `resource_version`."""
        body = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": resource_version}}
        await self._call(self.core.patch_namespaced_secret, name, namespace, body, field_manager=FIELD_MANAGER,
                         _content_type=MERGE)

    async def watch_secret(self, namespace: str, name: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, Secret) of one Secret, as the API server reports them; ends when the watch does.

        Listing and watching one object by name is what RBAC `resourceNames` can grant, unlike a namespace's
        Secrets. The blocking watch runs in a daemon thread, so it never holds up the operator's exit."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        def stream() -> None:
            try:
                for event in kubernetes.watch.Watch().stream(
                    self.core.list_namespaced_secret, namespace, field_selector=f"metadata.name={name}",
                    timeout_seconds=300,
                ):
                    loop.call_soon_threadsafe(queue.put_nowait, (event["type"], self._sanitize(event["object"])))
            except BaseException as exc:  # handed over to the awaiting side, which decides
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            loop.call_soon_threadsafe(queue.put_nowait, done)

        threading.Thread(target=stream, name=f"watch-secret-{name}", daemon=True).start()
        while (item := await queue.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item

    # The Gateway API Inference Extension's InferencePool: a custom resource of another project, which may not
    # be installed (its calls then raise a 404 ApiException).
    async def apply_pool(self, manifest: dict[str, Any]) -> dict[str, Any]:
        group, version = manifest["apiVersion"].split("/")
        meta = manifest["metadata"]
        return await self._call(self.custom.patch_namespaced_custom_object, group, version, meta["namespace"],
                                "inferencepools", meta["name"], manifest, field_manager=FIELD_MANAGER, force=True,
                                _content_type=APPLY)

    async def read_pool(self, group: str, version: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The pool, or None when there is none (or no InferencePool CRD)."""
        return await self._call_unless(404, self.custom.get_namespaced_custom_object, group, version, namespace,
                                       "inferencepools", name)

    async def delete_pool(self, group: str, version: str, namespace: str, name: str) -> None:
        await self._call_unless(404, self.custom.delete_namespaced_custom_object, group, version, namespace,
                                "inferencepools", name)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods `selector` matches, less those that carry a model's label without being its replicas
        (pods.replicas): whatever reads runtime pods (routing, adapters, autoscaler, status) sees only these."""
        result = await self._call(self.core.list_namespaced_pod, namespace, label_selector=selector)
        pods = result.get("items") or []
        claiming = [p for p in pods if claimed_model(p)]
        if not claiming:
            return pods
        replica_sets, deployments, models = await asyncio.gather(
            self._call(self.apps.list_namespaced_replica_set, namespace, label_selector=LABEL_MODEL),
            self._call(self.apps.list_namespaced_deployment, namespace, label_selector=LABEL_MODEL),
            self.list_custom(InferenceModel.plural, namespace))
        kept = {p["metadata"]["uid"] for p in replicas(claiming, replica_sets.get("items") or [],
                                                       deployments.get("items") or [], models)}
        return [p for p in pods if not claimed_model(p) or p["metadata"]["uid"] in kept]

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        await self._call_unless(404, self.core.patch_namespaced_pod, name, namespace,
                                {"metadata": {"annotations": annotations}}, _content_type=MERGE)

    async def list_custom(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        result = await self._call(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural)
        return result.get("items") or []

    async def get_custom(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call_unless(404, self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace,
                                       plural, name)

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A 404 (deleted meanwhile) is no error: nothing is left to report on."""
        await self._call_unless(404, self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace,
                                plural, name, {"status": status}, _content_type=MERGE)

    async def scale(self, plural: str, namespace: str, name: str, replicas: int) -> None:
        await self._call(
            self.custom.patch_namespaced_custom_object_scale, GROUP, VERSION, namespace, plural, name,
            {"spec": {"replicas": replicas}}, _content_type=MERGE,
        )

    def _peering_api(self, verb: str, body: dict[str, Any], *args: Any) -> tuple[Any, tuple[Any, ...]]:
        """The custom-objects call `verb` (create, get) for the peering object `body`, cluster-wide or
        namespaced as `body` is, and its leading arguments."""
        namespace = body["metadata"].get("namespace")
        if namespace is None:
            return (getattr(self.custom, f"{verb}_cluster_custom_object"),
                    (PEERING_GROUP, "v1", "clusterkopfpeerings", *args))
        return (getattr(self.custom, f"{verb}_namespaced_custom_object"),
                (PEERING_GROUP, "v1", namespace, "kopfpeerings", *args))

    async def ensure_peering(self, body: dict[str, Any]) -> None:
        """Creates the peering object `body` (builders.peering) unless it exists."""
        call, args = self._peering_api("create", body, body)
        await self._call_unless(409, call, *args)

    async def peering_exists(self, body: dict[str, Any]) -> bool:
        call, args = self._peering_api("get", body, body["metadata"]["name"])
        return await self._call_unless(404, call, *args) is not None
