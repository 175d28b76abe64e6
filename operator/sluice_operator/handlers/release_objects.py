"""The release's objects in each namespace its operator serves: the namespace's runtime credential, the runtime
pods' NetworkPolicy.

Applied when a namespace's models change (owners) or the credential does, always on a model's reconcile;
removed with the namespace's last model. An object of the same name the operator did not create is left
alone and reported: taking it over would hand the runtime pods someone else's Secret.
"""
from __future__ import annotations

import json
from typing import Any

from sluice_contracts import runtime_credential

from ..builders import build_credential_copy, build_runtime_network_policy
from ..builders.release import LABEL_RELEASE
from ..crd import MANAGED_BY
from ..state import OperatorState


def _names(state: OperatorState, namespace: str) -> list[tuple[str, str]]:
    """What the operator keeps in a served namespace, by kind and name."""
    release = state.release
    names = []
    if namespace != release.namespace:  # the release's own namespace's is beside the release key (credential.py)
        names.append(("Secret", release.credential_secret))
    if release.peers is not None:
        names.append(("NetworkPolicy", release.network_policy))
    return names


def _wanted(state: OperatorState, namespace: str, models: list[dict[str, Any]]) -> dict[tuple[str, str], dict]:
    release = state.release
    if not models:
        return {}
    credential = runtime_credential.for_namespace(state.credential, namespace)
    objects = {("Secret", release.credential_secret): build_credential_copy(release, namespace, credential, models)}
    if release.peers is not None:
        objects[("NetworkPolicy", release.network_policy)] = build_runtime_network_policy(release, namespace, models)
    return {key: obj for key, obj in objects.items() if key in _names(state, namespace)}


def _ours(state: OperatorState, obj: dict[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return labels.get("app.kubernetes.io/managed-by") == MANAGED_BY and labels.get(LABEL_RELEASE) == state.release.name


async def sync(state: OperatorState, namespace: str, models: list[dict[str, Any]], always: bool = False) -> list[str]:
    """Applies what the namespace needs now, removes what it no longer needs; returns 'Kind name' of each
    foreign object in the way."""
    if state.release is None or state.credential is None:
        return []  # not before the release key is known: a credential must never be removed for want of it
    wanted = _wanted(state, namespace, models)
    fingerprint = json.dumps(list(wanted.values()), sort_keys=True)
    if not always and state.release_applied.get(namespace) == fingerprint:
        return []
    conflicts = []
    for kind, name in _names(state, namespace):
        existing = await state.kube.read(kind, namespace, name)
        if existing is not None and not _ours(state, existing):
            if (kind, name) in wanted:
                conflicts.append(f"{kind} {name}")
        elif (kind, name) in wanted:
            await state.kube.apply(wanted[(kind, name)])
        elif existing is not None:
            await state.kube.delete(kind, namespace, name)
    if conflicts:
        state.release_applied.pop(namespace, None)  # looked at again on the next change
    else:
        state.release_applied[namespace] = fingerprint
    return conflicts
