"""The runtime credential: with `--api-key-file`, only a caller holding it (the gateway) gets past the open paths.

The file is the mounted Secret (sluice_contracts.runtime_credential). It is read at start, where a missing,
unreadable or empty file refuses to serve, and again whenever it has changed (one stat per request), so a
rotated Secret takes effect without a restart. The kubelet updates the gateway's copy and this pod's at
different times, so the credential it replaces stays valid for a grace period (`--api-key-grace-s`): a gateway
that has not seen the rotation yet is still served, and the old credential stops working once it has passed.
"""
from __future__ import annotations

import logging
import os
import threading

from sluice_contracts.runtime_credential import (
    HEADER, OPEN_PATHS, ROTATION_GRACE_S, CredentialFileError, RotatedCredential, header_value, presented_matches,
    read_credential_file,
)

log = logging.getLogger("sluice.server")
_HEADER = HEADER.encode()


class RuntimeCredential:
    def __init__(self, path: str, grace_s: float = ROTATION_GRACE_S):
        self.path = path
        self._credentials = RotatedCredential(read_credential_file(path, "api key file"), grace_s)
        self._identity = _identity(path)
        self._lock = threading.Lock()

    def refusal(self, path: str, headers: list[tuple[bytes, bytes]]) -> str | None:
        """None when the request may pass; else why it may not (the 401's message)."""
        if path in OPEN_PATHS:
            return None
        presented = [value for name, value in headers if name.lower() == _HEADER]
        if len(presented) > 1:
            return "Send exactly one Authorization header."
        if not presented:
            return (f"This runtime needs its credential: send '{header_value('<credential>')}' "
                    "(clients call the gateway, not the runtime).")
        self._reload_if_changed()
        value = presented[0].decode("latin-1")
        replaced = self._credentials.replaced
        # Both comparisons always run, so the time taken does not tell which credential nearly matched.
        current = presented_matches(value, self._credentials.current)
        previous = presented_matches(value, replaced or self._credentials.current)
        if current or (previous and replaced is not None):
            return None
        return "Incorrect runtime credential provided."

    def _reload_if_changed(self) -> None:
        identity = _identity(self.path)
        if identity is None or identity == self._identity:
            return
        with self._lock:
            try:
                credential = read_credential_file(self.path, "api key file")
            except CredentialFileError as exc:
                # A Secret being rewritten can be briefly empty; the current credential stays until it is good.
                log.warning("keeping the current runtime credential: %s", exc)
                return
            self._identity = identity
            if self._credentials.rotate(credential):
                log.info("runtime credential reloaded from %s; the previous one is accepted for %g s more",
                         self.path, self._credentials.grace_s)


def _identity(path: str) -> tuple[int, int, int] | None:
    # The inode too: the kubelet swaps a symlink to a new file, whose mtime may equal the old one's.
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
