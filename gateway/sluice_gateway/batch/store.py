"""The batch API's metadata in SQLite: files, batches and each batch line with its state and lease.

Every method opens its own connection, so callers run them in worker threads (asyncio.to_thread) and several
gateway replicas sharing the file take turns on its lock. A line is `pending`, `running` (leased to one replica
until `lease_until`) or `done` (with its output or error line); a done line is never written again, which is
what makes every custom_id appear exactly once in a batch's output or error file.
"""
from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, key_id TEXT NOT NULL, body TEXT NOT NULL, created_seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, custom_id TEXT NOT NULL, request TEXT NOT NULL,
    state TEXT NOT NULL, owner TEXT, lease_until REAL, attempts INTEGER NOT NULL DEFAULT 0, ok INTEGER,
    result TEXT, PRIMARY KEY (batch_id, line_no));
CREATE INDEX IF NOT EXISTS lines_by_state ON lines (state, lease_until);
"""


@dataclass(frozen=True, slots=True)
class Claimed:
    """A line leased to this replica."""

    batch_id: str
    line_no: int
    custom_id: str
    request: dict[str, Any]
    attempts: int
    tenant: str
    key_id: str
    endpoint: str


class BatchStore:
    def __init__(self, path: Path) -> None:
        self._path = path

    def exists(self) -> bool:
        return self._path.exists()

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self._path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    # -- files ---------------------------------------------------------------------------------------------
    def add_file(self, record: dict[str, Any], tenant: str) -> None:
        with self._db() as db:
            db.execute("INSERT OR IGNORE INTO files VALUES (?, ?, ?, ?, ?, ?)",
                       (record["id"], tenant, record["filename"], record["purpose"], record["bytes"],
                        record["created_at"]))

    def file(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        with self._db() as db:
            row = db.execute("SELECT id, filename, purpose, bytes, created_at FROM files WHERE id = ? AND tenant = ?",
                             (file_id, tenant)).fetchone()
        return _file(row) if row else None

    def files(self, tenant: str) -> list[dict[str, Any]]:
        with self._db() as db:
            rows = db.execute("SELECT id, filename, purpose, bytes, created_at FROM files WHERE tenant = ? "
                              "ORDER BY created_at DESC, id", (tenant,)).fetchall()
        return [_file(row) for row in rows]

    def delete_file(self, tenant: str, file_id: str) -> bool:
        with self._db() as db:
            return db.execute("DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)).rowcount > 0

    # -- batches -------------------------------------------------------------------------------------------
    def add_batch(self, batch: dict[str, Any], tenant: str, key_id: str,
                  lines: list[tuple[str, dict[str, Any]]]) -> None:
        """The batch and its lines, together: a batch is never seen without all of its lines."""
        with self._db() as db:
            seq = db.execute("SELECT COALESCE(MAX(created_seq), 0) + 1 FROM batches").fetchone()[0]
            db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?)", (batch["id"], tenant, key_id, json.dumps(batch), seq))
            db.executemany("INSERT INTO lines (batch_id, line_no, custom_id, request, state) VALUES (?, ?, ?, ?, ?)",
                           [(batch["id"], n, custom_id, json.dumps(request), "pending")
                            for n, (custom_id, request) in enumerate(lines)])

    def batch(self, tenant: str, batch_id: str) -> dict[str, Any] | None:
        with self._db() as db:
            row = db.execute("SELECT body FROM batches WHERE id = ? AND tenant = ?", (batch_id, tenant)).fetchone()
            return _with_counts(db, json.loads(row[0])) if row else None

    def batches(self, tenant: str, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """The tenant's batches, newest first, from the one after `after`; and whether more follow."""
        with self._db() as db:
            start = None
            if after is not None:
                row = db.execute("SELECT created_seq FROM batches WHERE id = ? AND tenant = ?",
                                 (after, tenant)).fetchone()
                start = row[0] if row else None
            rows = db.execute("SELECT body FROM batches WHERE tenant = ? AND created_seq < ? ORDER BY created_seq DESC "
                              "LIMIT ?", (tenant, start if start is not None else 1 << 62, limit + 1)).fetchall()
            found = [_with_counts(db, json.loads(row[0])) for row in rows[:limit]]
        return found, len(rows) > limit

    def owner_of(self, batch_id: str) -> tuple[str, str]:
        with self._db() as db:
            tenant, key_id = db.execute("SELECT tenant, key_id FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return tenant, key_id

    def update(self, tenant: str, batch_id: str, **fields: Any) -> dict[str, Any] | None:
        with self._db() as db:
            row = db.execute("SELECT body FROM batches WHERE id = ? AND tenant = ?", (batch_id, tenant)).fetchone()
            if row is None:
                return None
            batch = {**json.loads(row[0]), **fields}
            db.execute("UPDATE batches SET body = ? WHERE id = ?", (json.dumps(batch), batch_id))
            return _with_counts(db, batch)

    def cancel(self, tenant: str, batch_id: str, now: int) -> dict[str, Any] | None:
        """Stop the batch's lines not yet claimed at once (each an error line); the running ones finish."""
        with self._db() as db:
            row = db.execute("SELECT body FROM batches WHERE id = ? AND tenant = ?", (batch_id, tenant)).fetchone()
            if row is None:
                return None
            batch = json.loads(row[0])
            if batch["status"] in ("validating", "in_progress"):
                batch.update(status="cancelling", cancelling_at=now)
                db.execute("UPDATE batches SET body = ? WHERE id = ?", (json.dumps(batch), batch_id))
                _end_pending(db, batch_id, "batch_cancelled", "The batch was cancelled before this line ran.")
            return _with_counts(db, batch)

    # -- the executor --------------------------------------------------------------------------------------
    def expire(self, now: int) -> None:
        """Batches past their window take no new line: what is left is an error line each."""
        with self._db() as db:
            for batch_id, body in db.execute(
                    "SELECT id, body FROM batches WHERE json_extract(body, '$.status') = 'in_progress' AND "
                    "json_extract(body, '$.expires_at') <= ?", (now,)).fetchall():
                batch = {**json.loads(body), "status": "finalizing", "expired_at": now, "finalizing_at": now}
                db.execute("UPDATE batches SET body = ? WHERE id = ?", (json.dumps(batch), batch_id))
                _end_pending(db, batch_id, "batch_expired", "The batch expired before this line ran.")

    def claim(self, owner: str, count: int, lease_s: float) -> list[Claimed]:
        """Lease up to `count` lines: pending ones, or running ones whose replica stopped renewing its lease.
        Batches take turns, line by line, so that a long batch does not hold back the ones made after it."""
        now = time.time()
        with self._db() as db:
            rows = db.execute(
                "SELECT l.batch_id, l.line_no, l.custom_id, l.request, l.attempts, b.tenant, b.key_id, "
                "json_extract(b.body, '$.endpoint') FROM lines l JOIN batches b ON b.id = l.batch_id "
                "WHERE l.state = 'pending' OR (l.state = 'running' AND l.lease_until < ?) "
                "ORDER BY l.line_no, b.created_seq LIMIT ?", (now, count)).fetchall()
            db.executemany("UPDATE lines SET state = 'running', owner = ?, lease_until = ? WHERE batch_id = ? AND "
                           "line_no = ?", [(owner, now + lease_s, row[0], row[1]) for row in rows])
        return [Claimed(row[0], row[1], row[2], json.loads(row[3]), *row[4:]) for row in rows]

    def renew(self, owner: str, lease_s: float) -> None:
        with self._db() as db:
            db.execute("UPDATE lines SET lease_until = ? WHERE owner = ? AND state = 'running'",
                       (time.time() + lease_s, owner))

    def finish(self, line: Claimed, owner: str, ok: bool, result: dict[str, Any]) -> None:
        """Record a line's answer, unless its lease passed to another replica (which answers it instead)."""
        with self._db() as db:
            db.execute("UPDATE lines SET state = 'done', ok = ?, result = ? WHERE batch_id = ? AND line_no = ? AND "
                       "owner = ? AND state = 'running'", (int(ok), json.dumps(result), line.batch_id, line.line_no,
                                                          owner))

    def retry(self, line: Claimed, owner: str, counted: bool) -> None:
        """Hand a line back to be claimed again, counting an attempt against it or not."""
        with self._db() as db:
            db.execute("UPDATE lines SET state = 'pending', owner = NULL, attempts = attempts + ? WHERE batch_id = ? "
                       "AND line_no = ? AND owner = ? AND state = 'running'",
                       (int(counted), line.batch_id, line.line_no, owner))

    def to_finalize(self) -> list[str]:
        """Batches every line of which is done, not yet completed, expired or cancelled."""
        with self._db() as db:
            rows = db.execute("SELECT id FROM batches WHERE json_extract(body, '$.status') IN ('in_progress', "
                              "'cancelling', 'finalizing') AND NOT EXISTS (SELECT 1 FROM lines WHERE batch_id = "
                              "batches.id AND state != 'done')").fetchall()
        return [row[0] for row in rows]

    def results(self, batch_id: str) -> list[tuple[bool, dict[str, Any]]]:
        with self._db() as db:
            rows = db.execute("SELECT ok, result FROM lines WHERE batch_id = ? ORDER BY line_no", (batch_id,)).fetchall()
        return [(bool(ok), json.loads(result)) for ok, result in rows]


def _end_pending(db: sqlite3.Connection, batch_id: str, code: str, message: str) -> None:
    rows = db.execute("SELECT line_no, custom_id FROM lines WHERE batch_id = ? AND state = 'pending'",
                      (batch_id,)).fetchall()
    db.executemany("UPDATE lines SET state = 'done', ok = 0, result = ? WHERE batch_id = ? AND line_no = ?",
                   [(json.dumps(error_line(batch_id, line_no, custom_id, code, message)), batch_id, line_no)
                    for line_no, custom_id in rows])


def error_line(batch_id: str, line_no: int, custom_id: str, code: str, message: str) -> dict[str, Any]:
    """The error-file line of a line that got no answer."""
    return {"id": line_id(batch_id, line_no), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


def line_id(batch_id: str, line_no: int) -> str:
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line_no}"


def _with_counts(db: sqlite3.Connection, batch: dict[str, Any]) -> dict[str, Any]:
    total, completed, failed = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(state = 'done' AND ok = 1), 0), COALESCE(SUM(state = 'done' AND ok = 0), 0) "
        "FROM lines WHERE batch_id = ?", (batch["id"],)).fetchone()
    return {**batch, "request_counts": {"total": total, "completed": completed, "failed": failed}}


def _file(row: tuple) -> dict[str, Any]:
    file_id, filename, purpose, size, created_at = row
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created_at, "filename": filename,
            "purpose": purpose, "status": "processed", "expires_at": None, "status_details": None}
