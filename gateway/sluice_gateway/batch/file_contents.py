"""File contents on a local directory (a volume in the cluster), one file per id, each written whole or not at
all: a replica killed while writing leaves no half file under an id."""
from __future__ import annotations

import os
from pathlib import Path


class FileContents:
    def __init__(self, directory: Path) -> None:
        self._dir = directory

    def write(self, file_id: str, content: bytes) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        staged = self._dir / f".{file_id}.{os.getpid()}.staged"
        with staged.open("wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.replace(staged, self._dir / file_id)

    def read(self, file_id: str) -> bytes | None:
        try:
            return (self._dir / file_id).read_bytes()
        except FileNotFoundError:
            return None

    def delete(self, file_id: str) -> None:
        (self._dir / file_id).unlink(missing_ok=True)
