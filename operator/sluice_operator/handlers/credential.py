"""The runtime credential's source Secret: filled once with a random value, followed for changes.

The chart renders the Secret empty (so `helm uninstall` takes it away); the operator fills it, or creates
it where no chart did. A changed or recreated value is copied again into every namespace served.
"""
from __future__ import annotations

import asyncio
import logging
import secrets

from kubernetes.client.rest import ApiException

from ..builders import build_credential_source, read_credential
from ..state import OperatorState
from .routing import request_compile

log = logging.getLogger(__name__)
CREDENTIAL_BYTES = 32


async def ensure_source(state: OperatorState) -> str:
    """The credential in the source Secret, after filling or creating it when it holds none."""
    release, kube = state.release, state.kube
    while True:
        secret = await kube.read("Secret", release.namespace, release.credential_secret)
        value = read_credential(secret)
        if value is not None:
            return value
        source = build_credential_source(release, secrets.token_urlsafe(CREDENTIAL_BYTES))
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
        log.info("runtime credential created in %s/%s", release.namespace, release.credential_secret)
        return read_credential(source)


def _take(state: OperatorState, value: str) -> None:
    if value == state.credential:
        return
    rotated = state.credential is not None
    state.credential = value
    if rotated:
        log.info("runtime credential changed; copying it again into %s", ", ".join(sorted(state.release_applied)))
        for namespace in list(state.release_applied):
            request_compile(state, namespace)


async def follow_source(state: OperatorState) -> None:
    """Runs for the operator's lifetime: keeps `state.credential` equal to the source Secret's."""
    release = state.release
    while True:
        try:
            _take(state, await ensure_source(state))
            async for kind, secret in state.kube.watch_secret(release.namespace, release.credential_secret):
                if kind == "ERROR":
                    break  # an expired watch: read and watch again
                value = None if kind == "DELETED" else read_credential(secret)
                _take(state, value if value is not None else await ensure_source(state))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the API server away for a moment: the credential in hand stays in force
            log.warning("runtime credential %s/%s: %s; trying again", release.namespace, release.credential_secret,
                        exc)
            await asyncio.sleep(2.0)
