"""Where audit records go: nowhere, stdout, stderr or a file they are appended to, one JSON object a line.

Each record is one write of one whole line, flushed at once, so a log shipper tailing the file never reads half
a record and a gateway killed a moment later has lost none it wrote.
"""
from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("sluice_gateway.audit")


class AuditSink:
    def __init__(self, target: str | Path, failed: Callable[[], None] = lambda: None, *,
                 setting: str = "audit.sink", record: str = "audit record") -> None:
        """`failed` is called for each record that could not be written; `setting` and `record` name the sink and
        what it holds in what the log says of it."""
        self._failed = failed
        self._record = record
        self.problem: str | None = None  # why the file cannot be written: the gateway is not ready meanwhile
        self._stream: IO[str] | None = None
        self._owned = False
        if target == "stdout":
            self._stream = sys.stdout
        elif target == "stderr":
            self._stream = sys.stderr
        elif isinstance(target, Path):
            try:
                self._stream = target.open("a", encoding="utf-8")
            except OSError as exc:
                self.problem = f"{setting} {target} cannot be opened for writing: {exc.strerror}"
                log.error("%s", self.problem)
            else:
                self._owned = True

    @property
    def on(self) -> bool:
        return self._stream is not None

    def write(self, record: dict[str, Any]) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._stream.flush()
        except OSError as exc:  # a full disk: said in the log, the request is served all the same
            log.error("%s not written: %s", self._record, exc.strerror)
            self._failed()

    def close(self) -> None:
        if self._owned and self._stream is not None:
            self._stream.close()
        self._stream = None
