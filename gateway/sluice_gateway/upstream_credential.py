"""The `Authorization` value the gateway presents to runtimes, and what to try once when a runtime refuses it.

The kubelet updates the gateway's copy of a rotated Secret and each runtime's at different times. A runtime
that has rotated first still accepts the credential it replaced for a grace period (its side); a runtime that
has not rotated yet refuses the new one, so the gateway tries the one it replaced, for as long (this side).
A refusal also re-reads the file at once, in case it changed since the last periodic check.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from sluice_contracts.runtime_credential import ROTATION_GRACE_S, header_value


class UpstreamCredential:
    def __init__(self, recheck: Callable[[], None] = lambda: None, grace_s: float = ROTATION_GRACE_S) -> None:
        """`recheck`: re-read the credential file now (calls `use` if it changed)."""
        self.header: str | None = None  # None until a credential file is read (or none is configured)
        self._recheck = recheck
        self._grace_s = grace_s
        self._previous: str | None = None
        self._previous_until = 0.0

    def use(self, credential: str) -> None:
        header = header_value(credential)
        if self.header is not None and header != self.header:
            self._previous, self._previous_until = self.header, time.monotonic() + self._grace_s
        self.header = header

    def after_refusal(self, refused: str | None) -> str | None:
        """The value to try once more after a runtime refused `refused`, or None when there is nothing else."""
        self._recheck()
        if self.header != refused:
            return self.header
        if self._previous is not None and time.monotonic() < self._previous_until:
            return self._previous
        return None
