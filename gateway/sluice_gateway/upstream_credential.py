"""The `Authorization` value the gateway presents to runtimes, and what to try once when a runtime refuses it.

The kubelet updates the gateway's copy of a rotated Secret and each runtime's at different times. A runtime
that has rotated first still accepts the credential it replaced for a grace period (its side); a runtime that
has not rotated yet refuses the new one, so the gateway tries the one it replaced, for as long (this side).
A refusal also re-reads the file at once, in case it changed since the last periodic check.
"""
from __future__ import annotations

from collections.abc import Callable

from sluice_contracts.runtime_credential import ROTATION_GRACE_S, RotatedCredential, header_value


class UpstreamCredential:
    def __init__(self, recheck: Callable[[], None] = lambda: None, grace_s: float = ROTATION_GRACE_S) -> None:
        """`recheck`: re-read the credential file now (calls `use` if it changed)."""
        self.header: str | None = None  # None until a credential file is read (or none is configured)
        self._recheck = recheck
        self._grace_s = grace_s
        self._credentials: RotatedCredential | None = None

    def use(self, credential: str) -> None:
        if self._credentials is None:
            self._credentials = RotatedCredential(credential, self._grace_s)
        else:
            self._credentials.rotate(credential)
        self.header = header_value(credential)

    def after_refusal(self, refused: str | None) -> str | None:
        """The value to try once more after a runtime refused `refused`, or None when there is nothing else."""
        self._recheck()
        if self.header != refused:
            return self.header
        replaced = self._credentials.replaced if self._credentials is not None else None
        return header_value(replaced) if replaced is not None else None
