"""The few Kubernetes API calls the handlers make, run off the event loop (the official client is blocking)."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator

import kubernetes
from kubernetes.client.rest import ApiException

from ..crd import GROUP, VERSION

FIELD_MANAGER = "sluice-operator"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


def load_config() -> None:
    """In a pod: its service account. Elsewhere: $KUBECONFIG or ~/.kube/config."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


def not_found(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


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
        try:
            return await self._call(read, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        delete = {
            "Secret": self.core.delete_namespaced_secret,
            "NetworkPolicy": self.networking.delete_namespaced_network_policy,
        }[kind]
        try:
            await self._call(delete, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

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

    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._call(self.apps.read_namespaced_deployment, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        result = await self._call(self.core.list_namespaced_pod, namespace, label_selector=selector)
        return result.get("items") or []

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        try:
            await self._call(
                self.core.patch_namespaced_pod, name, namespace, {"metadata": {"annotations": annotations}},
                _content_type=MERGE,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._call(self.core.read_namespaced_config_map, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def delete_config_map(self, namespace: str, name: str) -> None:
        try:
            await self._call(self.core.delete_namespaced_config_map, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def list_custom(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        result = await self._call(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural)
        return result.get("items") or []

    async def get_custom(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._call(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            await self._call(
                self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace, plural, name,
                {"status": status}, _content_type=MERGE,
            )
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing left to report on
                raise

    async def scale(self, plural: str, namespace: str, name: str, replicas: int) -> None:
        await self._call(
            self.custom.patch_namespaced_custom_object_scale, GROUP, VERSION, namespace, plural, name,
            {"spec": {"replicas": replicas}}, _content_type=MERGE,
        )

    async def ensure_cluster_peering(self, name: str) -> None:
        body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
        try:
            await self._call(self.custom.create_cluster_custom_object, "kopf.dev", "v1", "clusterkopfpeerings", body)
        except ApiException as exc:
            if exc.status != 409:
                raise

    async def ensure_namespaced_peering(self, namespace: str, name: str) -> None:
        body = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": name, "namespace": namespace}}
        try:
            await self._call(
                self.custom.create_namespaced_custom_object, "kopf.dev", "v1", namespace, "kopfpeerings", body
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
