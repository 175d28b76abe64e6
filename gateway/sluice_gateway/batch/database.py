"""The batch store's database: SQLite (a file; the default, so `make run` needs nothing else) or PostgreSQL (a
`postgresql://` URL; what several replicas in a cluster share). store.py writes one SQL for both, with `?`
placeholders and no construct only one of them knows.

Each transaction holds the whole store's write lock from its first statement (SQLite's `BEGIN IMMEDIATE`; a
transaction-scoped advisory lock on PostgreSQL), so a claim, a quota check or a cancel sees no other writer's
half-done work. The store's transactions are short, and batch metadata is not where throughput is decided.
"""
from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import psycopg

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class UnusableUrlFile(Exception):
    """The file that should hold the database's URL does not."""


# What a store that cannot be used raises: the operator's to fix (the file's disk, the server, its password).
STORE_ERRORS: tuple[type[Exception], ...] = (OSError, sqlite3.Error, psycopg.Error, UnusableUrlFile)
# The advisory lock every PostgreSQL transaction takes: one number, the store's.
_PG_LOCK = 0x5C1CE


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Transaction(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> Any: ...


class Database(Protocol):
    def exists(self) -> bool: ...

    def transaction(self) -> contextlib.AbstractContextManager[Transaction]: ...


def shown(location: str) -> str:
    """The location as logs may show it: a URL's password left out."""
    if not location.startswith(POSTGRES_SCHEMES):
        return location
    parts = urlsplit(location)
    if parts.password is None:
        return location
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def open_database(location: str, schema: str, url_file: Path | None = None) -> Database:
    """`location`: a SQLite file's path or a PostgreSQL URL; `url_file`, when set, holds the URL instead."""
    if url_file is not None:
        return PostgresDatabase(lambda: url_in(url_file), schema)
    if location.startswith(POSTGRES_SCHEMES):
        return PostgresDatabase(lambda: location, schema)
    return SqliteDatabase(Path(location), schema)


def url_in(url_file: Path) -> str:
    """The PostgreSQL URL on the file's first line; never shown in the error, which names the file."""
    try:
        lines = url_file.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnusableUrlFile(f"{url_file}: {getattr(exc, 'strerror', None) or exc}") from None
    url = lines[0].strip() if lines else ""
    if not url.startswith(POSTGRES_SCHEMES):
        raise UnusableUrlFile(f"{url_file}: its first line is not a postgresql:// URL")
    return url


class SqliteDatabase:
    """A connection per worker thread, kept (opening one costs about as much as a small transaction); one left
    inside a transaction by a failure is replaced. The file is made ready (WAL, the schema) once per process, by
    one thread: SQLite answers "database is locked" at once, without waiting, to connections racing to switch a
    new file's journal mode."""

    def __init__(self, path: Path, schema: str) -> None:
        self._path = path
        self._schema = schema
        self._ready = False
        self._readying = threading.Lock()
        self._local = threading.local()

    def exists(self) -> bool:
        return self._path.exists()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._path, timeout=30, isolation_level=None)
        db.execute("PRAGMA synchronous=FULL")
        return db

    def _make_ready(self) -> None:
        with self._readying:
            if self._ready:
                return
            self._path.parent.mkdir(parents=True, exist_ok=True)
            db = self._connect()
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(self._schema)
            finally:
                db.close()
            self._ready = True

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        if not self._ready:
            self._make_ready()
        db = getattr(self._local, "connection", None)
        if db is None:
            db = self._local.connection = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # the ROLLBACK or COMMIT failed: start afresh rather than inside this one
                self._local.connection = None
                db.close()
            raise


class PostgresDatabase:
    """A connection per worker thread, kept; a broken one is replaced at the next transaction. The schema is
    created once per process, under the store's lock, as replicas may start together."""

    def __init__(self, url: Callable[[], str], schema: str) -> None:
        self._url = url
        self._schema = schema
        self._local = threading.local()
        self._schema_made = False

    def exists(self) -> bool:
        return True

    def _connection(self) -> psycopg.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None or connection.closed or connection.broken:
            connection = psycopg.connect(self._url(), connect_timeout=10)
            self._local.connection = connection
        return connection

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        connection = self._connection()
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_LOCK,))
            if not self._schema_made:
                for statement in filter(str.strip, self._schema.split(";")):
                    connection.execute(statement)
            yield _PostgresTransaction(connection)
        self._schema_made = True


class _PostgresTransaction:
    """store.py's `?` placeholders as psycopg's `%s`."""

    def __init__(self, connection: psycopg.Connection) -> None:
        self._connection = connection

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor:
        return self._connection.execute(sql.replace("?", "%s"), params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> None:
        with self._connection.cursor() as cursor:
            cursor.executemany(sql.replace("?", "%s"), rows)
