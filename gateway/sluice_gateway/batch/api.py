"""The HTTP side of `/v1/files` and `/v1/batches`: OpenAI's objects, each tenant seeing only its own (another
tenant's id answers 404, as an unknown one does)."""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from sluice_contracts.model_tasks import Task
from sluice_contracts.routing_table import RoutingTable

from ..auth import Principal
from ..config import Batch
from ..errors import GatewayError
from ..metrics import GatewayMetrics
from .database import STORE_ERRORS, shown
from .file_contents import FileContents
from .input_lines import read_lines
from .line_cost import line_tokens
from .multipart import form_fields
from .store import BatchStore, Line, QuotaExceeded

log = logging.getLogger("sluice_gateway.batch")

Answer = tuple[int, bytes, bytes]
# What a line's cost is read against: the routing table in force and gateway.yaml's default_max_tokens.
CostBasis = Callable[[], tuple[RoutingTable, int]]
_JSON = b"application/json"
# The endpoints a batch may target, and the task each is routed as.
ENDPOINTS: dict[str, Task] = {"/v1/chat/completions": "chat", "/v1/completions": "completion", "/v1/embeddings": "embedding"}
_WINDOW_S = {"24h": 24 * 3600}
# OpenAI's bounds on `expires_after.seconds`, and what a file gets without one (as OpenAI does for batch files).
_MIN_TTL_S, _MAX_TTL_S = 3600, 30 * 24 * 3600
_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_MAX_METADATA = 16


class BatchApi:
    def __init__(self, settings: Batch, cost_basis: CostBasis, metrics: GatewayMetrics) -> None:
        self.settings = settings
        self._metrics = metrics
        self.store = BatchStore(settings.database, settings.database_file)
        self.contents = FileContents(settings.files_dir)
        self._cost_basis = cost_basis

    async def serve(self, method: str, path: str, query: dict[str, str], principal: Principal, content_type: bytes,
                    body: bytes) -> Answer:
        try:
            return await self._serve(method, path, query, principal, content_type, body)
        except STORE_ERRORS as exc:
            # The database or the files' directory (a volume) cannot be used: the operator's to fix, so logged.
            where = self.settings.database_file or shown(self.settings.database)
            log.error("batch store %s / %s: %s", where, self.settings.files_dir, exc)
            raise GatewayError(503, "the batch store is unavailable; try again later",
                               code="batch_store_unavailable") from None

    async def _serve(self, method: str, path: str, query: dict[str, str], principal: Principal,
                     content_type: bytes, body: bytes) -> Answer:
        parts = path.strip("/").split("/")[1:]  # after "v1"
        resource, rest = parts[0], parts[1:]
        if rest and not _ID.match(rest[0]):
            raise _not_found(resource, rest[0])
        route = (resource, method, len(rest), rest[1] if len(rest) > 1 else None)
        tenant = principal.tenant
        if route == ("files", "POST", 0, None):
            return _json(await self._upload(principal, content_type, body))
        if route == ("files", "GET", 0, None):
            files = await asyncio.to_thread(self.store.files, tenant)
            return _json({"object": "list", "data": files, "has_more": False})
        if route[:3] == ("files", "GET", 1):
            return _json(await self._file(tenant, rest[0]))
        if route == ("files", "GET", 2, "content"):
            await self._file(tenant, rest[0])
            content = await asyncio.to_thread(self.contents.read, rest[0])
            if content is None:
                raise _not_found("files", rest[0])
            return 200, content, b"application/octet-stream"
        if route[:3] == ("files", "DELETE", 1):
            if not await asyncio.to_thread(self.store.delete_file, tenant, rest[0]):
                raise _not_found("files", rest[0])
            await asyncio.to_thread(self.contents.delete, rest[0])
            return _json({"id": rest[0], "object": "file", "deleted": True})
        if route == ("batches", "POST", 0, None):
            return _json(await self._create(principal, body))
        if route == ("batches", "GET", 0, None):
            return await self._list_batches(tenant, query)
        if route[:3] == ("batches", "GET", 1):
            return _json(await self._batch(tenant, rest[0]))
        if route == ("batches", "POST", 2, "cancel"):
            batch, ended = await asyncio.to_thread(self.store.cancel, tenant, rest[0], int(time.time()))
            if batch is None:
                raise _not_found("batches", rest[0])
            self._metrics.batch_lines.labels(tenant, "cancelled").inc(ended)
            return _json(batch)
        if method not in ("GET", "POST", "DELETE"):
            raise GatewayError(405, f"{method} is not allowed on {path}")
        raise GatewayError(404, f"no such endpoint: {path}", code="unknown_url")

    async def _list_batches(self, tenant: str, query: dict[str, str]) -> Answer:
        limit = query.get("limit", "20")
        if not limit.isdigit() or not 1 <= int(limit) <= 100:
            raise GatewayError(400, "limit must be a whole number from 1 to 100", param="limit",
                               code="invalid_value")
        found, more = await asyncio.to_thread(self.store.batches, tenant, query.get("after"), int(limit))
        return _json({"object": "list", "data": found, "first_id": found[0]["id"] if found else None,
                      "last_id": found[-1]["id"] if found else None, "has_more": more})

    async def _file(self, tenant: str, file_id: str) -> dict[str, Any]:
        record = await asyncio.to_thread(self.store.file, tenant, file_id)
        if record is None:
            raise _not_found("files", file_id)
        return record

    async def _batch(self, tenant: str, batch_id: str) -> dict[str, Any]:
        batch = await asyncio.to_thread(self.store.batch, tenant, batch_id)
        if batch is None:
            raise _not_found("batches", batch_id)
        return batch

    async def _upload(self, principal: Principal, content_type: bytes, body: bytes) -> dict[str, Any]:
        tenant = principal.tenant
        fields = form_fields(content_type, body)
        purpose = fields.get("purpose", (None, b""))[1].decode(errors="replace")
        if purpose != "batch":
            raise GatewayError(400, f"purpose must be 'batch', got {purpose!r}", param="purpose",
                               code="invalid_value")
        if "file" not in fields:
            raise GatewayError(400, "the form has no 'file' field", param="file", code="missing_required_parameter")
        filename, content = fields["file"]
        if len(content) > self.settings.max_file_bytes:
            raise GatewayError(413, f"the file is larger than the gateway's limit of {self.settings.max_file_bytes} "
                                    "bytes", param="file", code="file_too_large")
        if content.count(b"\n") + (not content.endswith(b"\n")) > self.settings.max_file_lines:
            raise GatewayError(413, f"the file has more than the gateway's limit of {self.settings.max_file_lines} "
                                    "lines", param="file", code="file_too_large")
        anchor, seconds = (fields.get(f"expires_after[{name}]", (None, None))[1] for name in ("anchor", "seconds"))
        ttl = _ttl("expires_after", None if anchor is None and seconds is None else {
            "anchor": (anchor or b"").decode(errors="replace"), "seconds": (seconds or b"").decode(errors="replace")})
        now = int(time.time())
        record: dict[str, Any] = {"id": f"file-{uuid.uuid4().hex}", "object": "file", "bytes": len(content),
                  "created_at": now, "filename": filename or "upload.jsonl", "purpose": purpose,
                  "status": "processed", "expires_at": now + ttl, "status_details": None}
        await asyncio.to_thread(self.contents.write, record["id"], content)
        quota = principal.limits.batch_file_bytes
        try:
            await asyncio.to_thread(self.store.add_file, record, tenant, quota)
        except QuotaExceeded as over:
            await asyncio.to_thread(self.contents.delete, record["id"])
            raise _over_quota(over, quota, "storage_limit_exceeded",
                              f"This file's {over.asked} bytes are more than the file storage limit of {quota} "
                              f"bytes of tenant {tenant!r}.",
                              f"File storage limit reached for tenant {tenant!r}: limit {quota} bytes, {over.held} "
                              f"held by its files and {over.asked} in this one. Delete files, or wait for some to "
                              "expire.") from None
        return record

    async def _create(self, principal: Principal, body: bytes) -> dict[str, Any]:
        try:
            request = json.loads(body)
        except ValueError:
            raise GatewayError(400, "the body is not valid JSON", code="invalid_json") from None
        if not isinstance(request, dict):
            raise GatewayError(400, "the body must be a JSON object", code="invalid_json")
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(request.get(name), str):
                raise GatewayError(400, f"{name} is required (a string)", param=name,
                                   code="missing_required_parameter")
        endpoint, window = request["endpoint"], request["completion_window"]
        if endpoint not in ENDPOINTS:
            raise GatewayError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint",
                               code="invalid_value")
        if window not in _WINDOW_S:
            raise GatewayError(400, "completion_window must be '24h'", param="completion_window",
                               code="invalid_value")
        metadata = _metadata(request.get("metadata"))
        output_ttl = _ttl("output_expires_after", request.get("output_expires_after"))
        input_file = await self._file(principal.tenant, request["input_file_id"])
        content = await asyncio.to_thread(self.contents.read, input_file["id"])
        if content is None:
            raise _not_found("files", input_file["id"])
        now = int(time.time())
        lines, problems = await asyncio.to_thread(read_lines, content, endpoint, principal.may_use)
        batch = {"id": f"batch_{uuid.uuid4().hex}", "object": "batch", "endpoint": endpoint, "errors": None,
                 "input_file_id": input_file["id"], "completion_window": window, "status": "in_progress",
                 "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": now,
                 "expires_at": now + _WINDOW_S[window], "finalizing_at": None, "completed_at": None,
                 "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                 "metadata": metadata}
        costed: list[Line] = []
        if problems:
            batch.update(status="failed", in_progress_at=None, failed_at=now,
                         errors={"object": "list", "data": problems})
        else:
            costed = await asyncio.to_thread(self._costed, principal, endpoint, lines)
        quota = principal.limits.batch_enqueued_tokens
        try:
            await asyncio.to_thread(self.store.add_batch, batch, principal.tenant, principal.key_id, costed, quota,
                                    output_ttl)
        except QuotaExceeded as over:
            raise _over_quota(over, quota, "token_limit_exceeded",
                              f"The lines of this batch may cost up to {over.asked} tokens, more than the limit of "
                              f"{quota} enqueued tokens of tenant {principal.tenant!r}. Split it into smaller "
                              "batches or lower its lines' max_tokens.",
                              f"Enqueued token limit reached for tenant {principal.tenant!r}: limit {quota} enqueued "
                              f"tokens, {over.held} held by its unfinished batches and {over.asked} asked for by "
                              "this one. Try again once some of its batches have finished.") from None
        return await self._batch(principal.tenant, batch["id"])

    def _costed(self, principal: Principal, endpoint: str, lines: list[tuple[str, dict[str, Any]]]) -> list[Line]:
        table, default_max_tokens = self._cost_basis()
        kind = ENDPOINTS[endpoint]
        return [Line(custom_id, body, line_tokens(body, kind, endpoint, table, principal.may_use, default_max_tokens))
                for custom_id, body in lines]


def _over_quota(over: QuotaExceeded, quota: int | None, code: str, alone: str, with_others: str) -> GatewayError:
    """400 for what can never fit (retrying is pointless), 429 for what fits once the tenant's other batches have
    run (or its other files are gone)."""
    if over.asked > (quota or 0):
        return GatewayError(400, alone, code=code)
    return GatewayError(429, with_others, code=code)


def _ttl(name: str, policy: Any) -> int:
    """The seconds of an `expires_after` policy (OpenAI's: anchored at the file's creation); 30 days when unset."""
    if policy is None:
        return _MAX_TTL_S
    seconds = policy.get("seconds") if isinstance(policy, dict) else None
    if isinstance(seconds, str) and seconds.isdigit():
        seconds = int(seconds)  # a form field
    if (not isinstance(policy, dict) or policy.get("anchor") != "created_at" or type(seconds) is not int
            or not _MIN_TTL_S <= seconds <= _MAX_TTL_S):
        raise GatewayError(400, f"{name} must be {{anchor: created_at, seconds: {_MIN_TTL_S} to {_MAX_TTL_S}}}",
                           param=name, code="invalid_value")
    return seconds


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if (not isinstance(value, dict) or len(value) > _MAX_METADATA
            or not all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                       for k, v in value.items())):
        raise GatewayError(400, f"metadata is at most {_MAX_METADATA} string pairs, keys up to 64 characters and "
                                "values up to 512", param="metadata", code="invalid_value")
    return value


def _not_found(resource: str, object_id: str) -> GatewayError:
    noun = "file" if resource == "files" else "batch"
    return GatewayError(404, f"No {noun} with id '{object_id}' found", param="id", code="not_found")


def _json(value: dict[str, Any]) -> Answer:
    return 200, json.dumps(value).encode(), _JSON
