"""The batch API's metadata: files, batches and each batch line with its state, lease and cost, in SQLite or
PostgreSQL (database.py) with one SQL for both.

Every method is one transaction, which holds the store's write lock, so callers run them in worker threads
(asyncio.to_thread) and several gateway replicas sharing the database take turns. A line is `pending` (claimable
from `not_before`), `running` (leased to one replica until `lease_until`) or `done` (with its output or error
line); a done line is never written again, which is what makes every custom_id appear exactly once in a batch's
output or error file. A line's `tokens` is what it may cost (line_cost.py): the lines not yet done are what
count against their tenant's quota of enqueued batch tokens.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .database import Transaction, open_database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes BIGINT NOT NULL, created_at BIGINT NOT NULL, expires_at BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, key_id TEXT NOT NULL, status TEXT NOT NULL,
    created_at BIGINT NOT NULL, expires_at BIGINT NOT NULL, body TEXT NOT NULL, created_seq BIGINT NOT NULL,
    output_ttl_s BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, custom_id TEXT NOT NULL, request TEXT NOT NULL,
    tokens BIGINT NOT NULL, state TEXT NOT NULL, owner TEXT, lease_until DOUBLE PRECISION,
    not_before DOUBLE PRECISION NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0, ok INTEGER, result TEXT,
    PRIMARY KEY (batch_id, line_no));
CREATE INDEX IF NOT EXISTS lines_by_state ON lines (state, lease_until);
CREATE INDEX IF NOT EXISTS lines_in_turn ON lines (state, line_no);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status);
CREATE INDEX IF NOT EXISTS files_by_expiry ON files (expires_at);
"""
_CLAIMABLE = ("SELECT l.batch_id, l.line_no, l.custom_id, l.request, l.attempts, b.tenant, b.key_id, b.body "
              "FROM lines l JOIN batches b ON b.id = l.batch_id WHERE ")
_IN_TURN = "ORDER BY l.line_no, b.created_seq LIMIT ?"
_FILE = "SELECT id, filename, purpose, bytes, created_at, expires_at FROM files"
# The states of a batch whose lines may still run or be written to its files.
_UNFINISHED = ("in_progress", "cancelling", "finalizing")
# Lines not yet done are read as `IN ('pending', 'running')`, which the index by state serves (done lines are
# kept, and outnumber them). Sums are cast back to BIGINT: PostgreSQL's SUM of one is a NUMERIC.
_PENDING_TOKENS = ("SELECT CAST(COALESCE(SUM(l.tokens), 0) AS BIGINT) FROM lines l JOIN batches b ON b.id = l.batch_id "
                   "WHERE b.tenant = ? AND l.state IN ('pending', 'running')")


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


@dataclass(frozen=True, slots=True)
class Line:
    """A validated input line, with what it may cost."""

    custom_id: str
    request: dict[str, Any]
    tokens: int


class QuotaExceeded(Exception):
    """A batch's lines (or a file's bytes) would take its tenant past its quota of enqueued batch tokens (or of
    stored bytes)."""

    def __init__(self, held: int, asked: int) -> None:
        super().__init__(held, asked)
        self.held = held  # what the tenant's other batches (or files) already take
        self.asked = asked  # what this one would add


class BatchStore:
    def __init__(self, location: str, url_file: Path | None = None) -> None:
        """`location`: a SQLite file's path or a PostgreSQL URL; `url_file`, when set, holds the URL instead."""
        self._db = open_database(location, _SCHEMA, url_file)

    def exists(self) -> bool:
        return self._db.exists()

    # -- files ---------------------------------------------------------------------------------------------
    def add_file(self, record: dict[str, Any], tenant: str, quota: int | None = None) -> None:
        """QuotaExceeded when the file and the tenant's files not yet expired pass `quota` bytes (None: no quota,
        as for the files a batch produces: they are always kept, and count against the tenant's next upload)."""
        with self._db.transaction() as db:
            if quota is not None:
                held = db.execute("SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM files WHERE tenant = ? AND "
                                  "expires_at > ?", (tenant, int(time.time()))).fetchone()[0]
                if held + record["bytes"] > quota:
                    raise QuotaExceeded(held, record["bytes"])
            db.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                       (record["id"], tenant, record["filename"], record["purpose"], record["bytes"],
                        record["created_at"], record["expires_at"]))

    def file(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        """The file, unless it expired (then it is as gone as a deleted one, before the sweep removes it)."""
        with self._db.transaction() as db:
            row = db.execute(f"{_FILE} WHERE id = ? AND tenant = ? AND expires_at > ?",
                             (file_id, tenant, int(time.time()))).fetchone()
        return _file(row) if row else None

    def files(self, tenant: str) -> list[dict[str, Any]]:
        with self._db.transaction() as db:
            rows = db.execute(f"{_FILE} WHERE tenant = ? AND expires_at > ? ORDER BY created_at DESC, id",
                              (tenant, int(time.time()))).fetchall()
        return [_file(row) for row in rows]

    def expired_files(self, now: int) -> list[str]:
        """The files expired by `now`, whose contents are to be deleted before their records (forget_files), so
        that a replica killed in between leaves no content behind without a record."""
        with self._db.transaction() as db:
            return [row[0] for row in db.execute("SELECT id FROM files WHERE expires_at <= ?", (now,)).fetchall()]

    def forget_files(self, file_ids: list[str]) -> None:
        with self._db.transaction() as db:
            db.executemany("DELETE FROM files WHERE id = ?", [(file_id,) for file_id in file_ids])

    def delete_file(self, tenant: str, file_id: str) -> bool:
        with self._db.transaction() as db:
            return db.execute("DELETE FROM files WHERE id = ? AND tenant = ? AND expires_at > ?",
                              (file_id, tenant, int(time.time()))).rowcount > 0

    # -- batches -------------------------------------------------------------------------------------------
    def add_batch(self, batch: dict[str, Any], tenant: str, key_id: str, lines: list[Line], quota: int | None,
                  output_ttl_s: int) -> None:
        """The batch and its lines, together: a batch is never seen without all of its lines. QuotaExceeded
        when its lines and the tenant's lines not yet done pass `quota` (None: no quota); checked in the same
        transaction, so batches made at once cannot pass it together."""
        with self._db.transaction() as db:
            batch_tokens = sum(line.tokens for line in lines)
            if quota is not None and lines:
                enqueued = db.execute(_PENDING_TOKENS, (tenant,)).fetchone()[0]
                if enqueued + batch_tokens > quota:
                    raise QuotaExceeded(enqueued, batch_tokens)
            seq = db.execute("SELECT COALESCE(MAX(created_seq), 0) + 1 FROM batches").fetchone()[0]
            db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (batch["id"], tenant, key_id, batch["status"], batch["created_at"], batch["expires_at"],
                        json.dumps(batch), seq, output_ttl_s))
            db.executemany("INSERT INTO lines (batch_id, line_no, custom_id, request, tokens, state) "
                           "VALUES (?, ?, ?, ?, ?, 'pending')",
                           [(batch["id"], n, line.custom_id, json.dumps(line.request), line.tokens)
                            for n, line in enumerate(lines)])

    def batch(self, tenant: str, batch_id: str) -> dict[str, Any] | None:
        with self._db.transaction() as db:
            row = db.execute("SELECT body FROM batches WHERE id = ? AND tenant = ?", (batch_id, tenant)).fetchone()
            return _with_counts(db, json.loads(row[0])) if row else None

    def batches(self, tenant: str, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """The tenant's batches, newest first, from the one after `after`; and whether more follow."""
        with self._db.transaction() as db:
            start = None
            if after is not None:
                row = db.execute("SELECT created_seq FROM batches WHERE id = ? AND tenant = ?",
                                 (after, tenant)).fetchone()
                start = row[0] if row else None
            rows = db.execute("SELECT body FROM batches WHERE tenant = ? AND created_seq < ? ORDER BY created_seq DESC "
                              "LIMIT ?", (tenant, start if start is not None else 1 << 62, limit + 1)).fetchall()
            found = [_with_counts(db, json.loads(row[0])) for row in rows[:limit]]
        return found, len(rows) > limit

    def owner_of(self, batch_id: str) -> tuple[str, int]:
        """The batch's tenant, and how long its output and error files are kept."""
        with self._db.transaction() as db:
            tenant, ttl = db.execute("SELECT tenant, output_ttl_s FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return tenant, ttl

    def update(self, tenant: str, batch_id: str, **fields: Any) -> dict[str, Any] | None:
        with self._db.transaction() as db:
            row = db.execute("SELECT body FROM batches WHERE id = ? AND tenant = ?", (batch_id, tenant)).fetchone()
            if row is None:
                return None
            batch = {**json.loads(row[0]), **fields}
            _put(db, batch)
            return _with_counts(db, batch)

    def cancel(self, tenant: str, batch_id: str, now: int) -> tuple[dict[str, Any] | None, int]:
        """Stop the batch's lines not yet claimed at once (each an error line); the running ones finish. The
        batch, and how many lines were stopped."""
        with self._db.transaction() as db:
            row = db.execute("SELECT body FROM batches WHERE id = ? AND tenant = ?", (batch_id, tenant)).fetchone()
            if row is None:
                return None, 0
            batch, ended = json.loads(row[0]), 0
            if batch["status"] in ("validating", "in_progress"):
                batch.update(status="cancelling", cancelling_at=now)
                _put(db, batch)
                ended = _end_pending(db, batch_id, "batch_cancelled", "The batch was cancelled before this line ran.")
            return _with_counts(db, batch), ended

    # -- the executor --------------------------------------------------------------------------------------
    def expire(self, now: int) -> list[tuple[str, int]]:
        """Batches past their window take no new line: what is left is an error line each. Each expired batch's
        tenant, and how many of its lines were stopped."""
        ended = []
        with self._db.transaction() as db:
            for tenant, body in db.execute("SELECT tenant, body FROM batches WHERE status = 'in_progress' AND "
                                           "expires_at <= ?", (now,)).fetchall():
                batch = {**json.loads(body), "status": "finalizing", "expired_at": now, "finalizing_at": now}
                _put(db, batch)
                ended.append((tenant, _end_pending(db, batch["id"], "batch_expired",
                                                   "The batch expired before this line ran.")))
        return ended

    def claim(self, owner: str, count: int, lease_s: float) -> list[Claimed]:
        """Lease up to `count` lines: first running ones whose replica stopped renewing its lease, then pending
        ones whose retry time has come. Batches take turns, line by line, so that a long batch does not hold back
        the ones made after it. Each part is read in turn order from an index, so a claim costs what it takes,
        not what the batches hold."""
        now = time.time()
        with self._db.transaction() as db:
            rows = db.execute(_CLAIMABLE + "l.state = 'running' AND l.lease_until < ? " + _IN_TURN,
                              (now, count)).fetchall()
            if len(rows) < count:
                rows += db.execute(_CLAIMABLE + "l.state = 'pending' AND l.not_before <= ? " + _IN_TURN,
                                   (now, count - len(rows))).fetchall()
            db.executemany("UPDATE lines SET state = 'running', owner = ?, lease_until = ? WHERE batch_id = ? AND "
                           "line_no = ?", [(owner, now + lease_s, row[0], row[1]) for row in rows])
        return [Claimed(row[0], row[1], row[2], json.loads(row[3]), row[4], row[5], row[6],
                        json.loads(row[7])["endpoint"]) for row in rows]

    def renew(self, owner: str, lease_s: float) -> None:
        with self._db.transaction() as db:
            db.execute("UPDATE lines SET lease_until = ? WHERE owner = ? AND state = 'running'",
                       (time.time() + lease_s, owner))

    def finish(self, owner: str, answers: list[tuple[Claimed, bool, dict[str, Any]]]) -> list[bool]:
        """Record lines' answers (line, whether it succeeded, its output or error line) in one transaction,
        each unless its lease passed to another replica (which answers it instead); whether each was recorded."""
        with self._db.transaction() as db:
            return [db.execute(
                "UPDATE lines SET state = 'done', ok = ?, result = ? WHERE batch_id = ? AND line_no = ? AND "
                "owner = ? AND state = 'running'",
                (int(ok), json.dumps(result), line.batch_id, line.line_no, owner)).rowcount > 0
                for line, ok, result in answers]

    def retry(self, line: Claimed, owner: str, counted: bool, delay_s: float = 0.0) -> str | None:
        """Hand a line back to be claimed again in `delay_s`, counting an attempt against it or not; a line of a
        batch cancelled or expired meanwhile is not tried again: it ends as an error line, as the batch's other
        lines not yet run did, and the answer is why ("cancelled" or "expired")."""
        with self._db.transaction() as db:
            status = db.execute("SELECT status FROM batches WHERE id = ?", (line.batch_id,)).fetchone()[0]
            if status != "in_progress":
                code, why = (("batch_cancelled", "cancelled") if status == "cancelling" else ("batch_expired", "expired"))
                db.execute("UPDATE lines SET state = 'done', ok = 0, result = ? WHERE batch_id = ? AND line_no = ? "
                           "AND owner = ? AND state = 'running'",
                           (json.dumps(error_line(line.batch_id, line.line_no, line.custom_id, code,
                                                  f"The batch was {why} before this line could be tried again.")),
                            line.batch_id, line.line_no, owner))
                return why
            db.execute("UPDATE lines SET state = 'pending', owner = NULL, attempts = attempts + ?, not_before = ? "
                       "WHERE batch_id = ? AND line_no = ? AND owner = ? AND state = 'running'",
                       (int(counted), time.time() + delay_s, line.batch_id, line.line_no, owner))
            return None

    def to_finalize(self) -> list[str]:
        """Batches every line of which is done, not yet completed, expired or cancelled."""
        with self._db.transaction() as db:
            rows = db.execute("SELECT id FROM batches WHERE status IN (?, ?, ?) AND NOT EXISTS (SELECT 1 FROM lines "
                              "WHERE batch_id = batches.id AND state != 'done')", _UNFINISHED).fetchall()
        return [row[0] for row in rows]

    def results(self, batch_id: str) -> list[tuple[bool, dict[str, Any]]]:
        with self._db.transaction() as db:
            rows = db.execute("SELECT ok, result FROM lines WHERE batch_id = ? ORDER BY line_no", (batch_id,)).fetchall()
        return [(bool(ok), json.loads(result)) for ok, result in rows]

    # -- what /metrics reads -------------------------------------------------------------------------------
    def census(self) -> Census:
        with self._db.transaction() as db:
            states = dict(db.execute("SELECT status, COUNT(*) FROM batches GROUP BY status").fetchall())
            enqueued = dict(db.execute(
                "SELECT b.tenant, CAST(SUM(l.tokens) AS BIGINT) FROM lines l JOIN batches b ON b.id = l.batch_id "
                "WHERE l.state IN ('pending', 'running') GROUP BY b.tenant").fetchall())
            oldest = db.execute("SELECT MIN(b.created_at) FROM lines l JOIN batches b ON b.id = l.batch_id "
                                "WHERE l.state IN ('pending', 'running')").fetchone()[0]
        return Census(states, enqueued, oldest)


@dataclass(frozen=True, slots=True)
class Census:
    """The store as a whole, as every replica reads it: batches by state, the tokens of each tenant's lines not
    yet done, and when the oldest batch with a line not yet done was made (None: every line is done)."""

    batches_by_state: dict[str, int]
    enqueued_tokens: dict[str, int]
    oldest_waiting_created_at: int | None


def _put(db: Transaction, batch: dict[str, Any]) -> None:
    db.execute("UPDATE batches SET body = ?, status = ?, expires_at = ? WHERE id = ?",
               (json.dumps(batch), batch["status"], batch["expires_at"], batch["id"]))


def _end_pending(db: Transaction, batch_id: str, code: str, message: str) -> int:
    rows = db.execute("SELECT line_no, custom_id FROM lines WHERE batch_id = ? AND state = 'pending'",
                      (batch_id,)).fetchall()
    db.executemany("UPDATE lines SET state = 'done', ok = 0, result = ? WHERE batch_id = ? AND line_no = ?",
                   [(json.dumps(error_line(batch_id, line_no, custom_id, code, message)), batch_id, line_no)
                    for line_no, custom_id in rows])
    return len(rows)


def error_line(batch_id: str, line_no: int, custom_id: str, code: str, message: str) -> dict[str, Any]:
    """The error-file line of a line that got no answer."""
    return {"id": line_id(batch_id, line_no), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


def line_id(batch_id: str, line_no: int) -> str:
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line_no}"


def _with_counts(db: Transaction, batch: dict[str, Any]) -> dict[str, Any]:
    total, completed, failed = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(CASE WHEN state = 'done' AND ok = 1 THEN 1 ELSE 0 END), 0), "
        "COALESCE(SUM(CASE WHEN state = 'done' AND ok = 0 THEN 1 ELSE 0 END), 0) FROM lines WHERE batch_id = ?",
        (batch["id"],)).fetchone()
    return {**batch, "request_counts": {"total": total, "completed": completed, "failed": failed}}


def _file(row: tuple) -> dict[str, Any]:
    file_id, filename, purpose, size, created_at, expires_at = row
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created_at, "filename": filename,
            "purpose": purpose, "status": "processed", "expires_at": expires_at, "status_details": None}
