"""Noticing that a mounted file changed, by polling its identity.

Polling works for Secret and ConfigMap volumes too, whose kubelet swaps a symlink (the target's inode
changes), and needs no inotify; a stat per file per interval costs nothing next to a request.
"""
from __future__ import annotations

import os
from pathlib import Path

_GONE = object()


class FileWatch:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: object = None  # nothing seen yet: the first look always counts as a change

    def _identity(self) -> object:
        try:
            st = os.stat(self.path)
        except OSError:
            return _GONE
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def changed(self) -> bool:
        """Whether the file differs from when this was last asked (appeared, changed or went away)."""
        identity = self._identity()
        if identity == self._seen:
            return False
        self._seen = identity
        return True

    @property
    def exists(self) -> bool:
        return self._seen is not _GONE
