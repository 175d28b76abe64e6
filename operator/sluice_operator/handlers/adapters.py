"""Keep each serving replica's LoRA adapters equal to its InferenceModel's list, through the runtime's API, so an
edit of the list needs no rollout; publish where each adapter is loaded (routing table) and its state (status).

Runs after a reconcile, when the model's pods change (a replica that becomes ready gets the adapters its
template did not start with) and on a timer (a runtime restarted in place starts with its template's list).
A replica that cannot be reached is left out: its adapters are not published until it answers.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import kopf
from pydantic import ValidationError

from sluice_contracts import runtime_credential

from ..adapter_sync import RuntimeApiError, adapters_loaded, load_adapter, plan, unload_adapter
from ..admin_events import adapter_events
from ..builders import selector_string
from ..builders.adapters import adapter_path
from ..crd import InferenceModel, InferenceModelSpec
from ..pods import addresses, base_url, ready
from ..state import ModelAdapters, OperatorState
from .model_status import request_refresh
from .routing import request_compile

log = logging.getLogger(__name__)
# How often every replica's adapters are checked again, with no event to prompt it.
RESYNC_SECONDS = 30.0


async def _sync_pod(session: aiohttp.ClientSession, credential: str | None, url: str,
                    wanted: dict[str, str]) -> dict[str, tuple[str, str]] | None:
    """Adapter → (state, message) on one replica after bringing it in line: each declared adapter, and any other
    it still holds (an unload that failed), as Loaded; None when it cannot be asked."""
    try:
        on = await adapters_loaded(session, url, credential)
    except RuntimeApiError as exc:
        log.info("adapters of %s: %s", url, exc)
        return None
    found: dict[str, tuple[str, str]] = {}
    for step in plan(wanted, on):
        try:
            if step.action == "unload":
                await unload_adapter(session, url, credential, step.name)
                on.pop(step.name, None)
            else:
                await load_adapter(session, url, credential, step.name, step.path)
                on[step.name] = step.path
        except RuntimeApiError as exc:
            if step.action == "load":
                found[step.name] = ("Failed", str(exc))
            log.warning("%s adapter %s on %s: %s", step.action, step.name, url, exc)
    for name in on:
        if name not in found:
            found[name] = ("Loaded", "")
    return found


async def sync(state: OperatorState, namespace: str, name: str) -> None:
    key = (namespace, name)
    model = await state.kube.get_custom(InferenceModel.plural, namespace, name)
    try:
        spec = InferenceModelSpec.model_validate((model or {}).get("spec") or {})
    except ValidationError:
        spec = None
    if model is None or spec is None or spec.adapters is None:
        if state.adapters.pop(key, None) is not None:
            request_compile(state, namespace)
        return
    wanted = {a.name: adapter_path(a) for a in spec.adapters}
    pods = [p for p in await state.kube.list_pods(namespace, selector_string(name)) if ready(p)]
    credential = runtime_credential.for_namespace(state.credential, namespace) if state.credential else None
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *(_sync_pod(session, credential, base_url(addresses(p)[0]), wanted) for p in pods))
    loaded: dict[str, frozenset[str]] = {}
    replicas: dict[str, dict[str, tuple[str, str]]] = {}
    for pod, found in zip(pods, results):
        if found is None:
            continue
        replicas[pod["metadata"]["name"]] = found
        names = frozenset(n for n, (s, _) in found.items() if s == "Loaded")
        for address in addresses(pod):
            loaded[base_url(address)] = names
    current = ModelAdapters(loaded, replicas)
    previous = state.adapters.get(key)
    state.adapters[key] = current
    if previous == current:
        return
    _report_failures(model, previous, current)
    for event in adapter_events(previous.replicas if previous is not None else {}, current.replicas):
        kopf.info(model, reason=event.reason, message=event.message)
    request_compile(state, namespace)
    request_refresh(state, namespace, name)


def _report_failures(model: dict[str, Any], previous: ModelAdapters | None, current: ModelAdapters) -> None:
    """A Warning event for each adapter that newly failed to load on a replica."""
    before = previous.replicas if previous is not None else {}
    for pod, adapters in current.replicas.items():
        for adapter, (state, message) in adapters.items():
            if state == "Failed" and before.get(pod, {}).get(adapter) != (state, message):
                kopf.warn(model, reason="AdapterLoadFailed", message=f"adapter {adapter} on {pod}: {message}")


def request_sync(state: OperatorState, namespace: str, name: str) -> None:
    state.adapter_syncs.request((namespace, name), lambda: sync(state, namespace, name))
