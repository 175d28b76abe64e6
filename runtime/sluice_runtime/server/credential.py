"""The runtime credential: with `--api-key-file`, only a caller holding it (the gateway) gets past the open paths.

The file is the mounted Secret (sluice_contracts.runtime_credential). It is read at start, where a missing,
unreadable or empty file refuses to serve, and again whenever it has changed (one stat per request), so a
rotated Secret takes effect, and the old credential stops working, without a restart.
"""
from __future__ import annotations

import logging
import os
import threading

from sluice_contracts.runtime_credential import (
    HEADER, OPEN_PATHS, CredentialFileError, header_value, presented_matches, read_credential_file,
)

log = logging.getLogger("sluice.server")
_HEADER = HEADER.encode()


class RuntimeCredential:
    def __init__(self, path: str):
        self.path = path
        self._credential = read_credential_file(path, "api key file")
        self._mtime = _mtime(path)
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
        if presented_matches(presented[0].decode("latin-1"), self._credential):
            return None
        return "Incorrect runtime credential provided."

    def _reload_if_changed(self) -> None:
        mtime = _mtime(self.path)
        if mtime is None or mtime == self._mtime:
            return
        with self._lock:
            try:
                credential = read_credential_file(self.path, "api key file")
            except CredentialFileError as exc:
                # A Secret being rewritten can be briefly empty; the previous credential stays until it is good.
                log.warning("keeping the previous runtime credential: %s", exc)
                return
            self._mtime = mtime
            if credential != self._credential:
                self._credential = credential
                log.info("runtime credential reloaded from %s", self.path)


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
