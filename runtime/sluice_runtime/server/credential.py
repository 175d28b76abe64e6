"""The runtime credential: with `--api-key-file`, only a caller holding it (the gateway) gets past the open paths.

The file is the mounted Secret (sluice_contracts.runtime_credential). It is read at start, where a missing,
unreadable or empty file refuses to serve, and again whenever it has changed (one stat per request), so a
rotated Secret takes effect without a restart. The kubelet updates the gateway's copy and this pod's at
different times, so the credential it replaces stays valid for a grace period (`--api-key-grace-s`): a gateway
that has not seen the rotation yet is still served, and the old credential stops working once it has passed.
"""
from __future__ import annotations

from sluice_contracts.runtime_credential import OPEN_PATHS, ROTATION_GRACE_S, FollowedCredential, header_value

_MISSING = (f"This runtime needs its credential: send '{header_value('<credential>')}' "
            "(clients call the gateway, not the runtime).")


class RuntimeCredential:
    def __init__(self, path: str, grace_s: float = ROTATION_GRACE_S):
        self.path = path
        self._credential = FollowedCredential(path, grace_s, "api key file")

    def refusal(self, path: str, headers: list[tuple[bytes, bytes]]) -> str | None:
        """None when the request may pass; else why it may not (the 401's message)."""
        if path in OPEN_PATHS:
            return None
        return self._credential.refusal(headers, _MISSING)
