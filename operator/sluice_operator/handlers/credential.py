"""The release's key (sluice_contracts.runtime_credential): made once at random, followed for changes.

It lives in the Secret of the release's namespace that also holds that namespace's own runtime credential.
The chart renders the Secret empty (so `helm uninstall` takes it away); the operator fills it, or creates
it where no chart did. A new key (replaced, or the Secret deleted) renews every namespace's credential.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from typing import Any

from kubernetes.client.rest import ApiException

from sluice_contracts import runtime_credential

from ..builders import build_credential_source, read_credential
from ..state import OperatorState
from .routing import request_compile

log = logging.getLogger(__name__)
CREDENTIAL_BYTES = 32


def _release_key(secret: dict[str, Any] | None) -> str | None:
    # read_credential reads the credential's own key: shown it the release key's value instead.
    data = (secret or {}).get("data") or {}
    return read_credential({"data": {runtime_credential.SECRET_KEY: data.get(runtime_credential.RELEASE_KEY)}})


async def ensure_source(state: OperatorState) -> str:
    """The release's key, after making it when the Secret holds none, and setting the release namespace's own
    credential beside it when that is not the one the key makes."""
    release, kube = state.release, state.kube
    while True:
        secret = await kube.read("Secret", release.namespace, release.credential_secret)
        key = _release_key(secret)
        if key is not None and read_credential(secret) == runtime_credential.for_namespace(key, release.namespace):
            return key
        key = key or secrets.token_urlsafe(CREDENTIAL_BYTES)
        source = build_credential_source(release, runtime_credential.for_namespace(key, release.namespace))
        source["data"][runtime_credential.RELEASE_KEY] = base64.b64encode(key.encode()).decode()
        try:
            if secret is None:
                # Applied (a create that names the Secret), so RBAC can grant it for this name alone. Two
                # replicas racing here both follow the Secret afterwards and settle on the last value.
                await kube.apply(source)
            else:
                # The chart's empty Secret: only its key is filled; its labels stay Helm's.
                await kube.patch_secret_if_unchanged(
                    release.namespace, release.credential_secret, secret["metadata"]["resourceVersion"],
                    {"data": source["data"]},
                )
        except ApiException as exc:
            if exc.status == 409:
                continue  # the Secret changed since it was read: read it again
            raise
        log.info("runtime credentials set in %s/%s", release.namespace, release.credential_secret)
        return key


def _take(state: OperatorState, value: str) -> None:
    if value == state.credential:
        return
    rotated = state.credential is not None
    state.credential = value
    if rotated:
        log.info("release key changed; renewing the runtime credential of %s",
                 ", ".join(sorted(state.release_applied)))
        for namespace in list(state.release_applied):
            request_compile(state, namespace)


async def follow_source(state: OperatorState) -> None:
    """Runs for the operator's lifetime: keeps `state.credential` equal to the release's key in its Secret."""
    release = state.release
    while True:
        try:
            _take(state, await ensure_source(state))
            async for kind, secret in state.kube.watch_secret(release.namespace, release.credential_secret):
                if kind == "ERROR":
                    break  # an expired watch: read and watch again
                key = None if kind == "DELETED" else _release_key(secret)
                own = runtime_credential.for_namespace(key, release.namespace) if key is not None else None
                _take(state, key if own is not None and read_credential(secret) == own else await ensure_source(state))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the API server away for a moment: the credential in hand stays in force
            log.warning("runtime credential %s/%s: %s; trying again", release.namespace, release.credential_secret,
                        exc)
            await asyncio.sleep(2.0)
