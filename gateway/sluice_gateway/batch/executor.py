"""Runs batch lines: each gateway replica claims lines with a lease (store.py), sends each through the gateway's
own request path at the batch priority class, and records its answer; a replica that dies leaves its leases to
run out, and another replica (or itself, restarted) runs those lines. A line whose answer was recorded is never
run again; a line that was running when its replica died is run once more, since its answer was never kept.
A line whose attempt failed for a reason that may pass (429, 5xx, a runtime that cannot be reached) is handed
back to be claimed after a backoff (`batch.retry_backoff_s`, doubled after each failure, with jitter so that lines
that failed together do not return together), until `batch.max_attempts`; its last answer is then its error line.

When a batch's last line is done, its output and error files are written (one line per input line, by
custom_id, in input order) and it ends completed, expired or cancelled.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ..metrics import GatewayMetrics
from .api import BatchApi
from .database import STORE_ERRORS
from .store import Claimed, line_id

log = logging.getLogger("sluice_gateway.batch")

# (tenant, key id, endpoint, body, batch id) -> (status, answer body, the line's request id)
RunLine = Callable[[str, str, str, dict[str, Any], str], Awaitable[tuple[int, bytes, str]]]
_POLL_S = 0.5
_RETRIED = frozenset({429, 500, 502, 503, 504})
# Refusals that say "not now" (every replica saturated with more urgent work, or the model still starting): the
# line waits for capacity as long as its batch's window lasts, without using up its attempts.
_WAIT_CODES = frozenset({"saturated", "model_starting"})
_MAX_BACKOFF_S = 600.0


class BatchExecutor:
    def __init__(self, api_of: Callable[[], BatchApi | None], run_line: RunLine, metrics: GatewayMetrics) -> None:
        self._api_of = api_of  # None until the gateway has read its config
        self._run_line = run_line
        self._metrics = metrics
        self._owner = uuid.uuid4().hex
        self._running: set[asyncio.Task] = set()
        self._renewed = time.monotonic()
        # Answers waiting to be recorded, and the task recording them: one transaction takes every answer that
        # arrived while the last one was written (a step of the runtime ends many lines at once).
        self._answers: list[tuple[Claimed, bool, dict[str, Any], asyncio.Future[bool]]] = []
        self._recorder: asyncio.Task | None = None

    async def run(self) -> None:
        try:
            while True:
                api = self._api_of()
                try:
                    claimed = await self._step(api) if api is not None and api.store.exists() else False
                except STORE_ERRORS as exc:
                    log.error("batch store unavailable: %s", exc)
                    claimed = False
                if self._running:
                    await asyncio.wait(self._running, timeout=_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                elif not claimed:
                    await asyncio.sleep(_POLL_S)
        finally:
            for task in self._running:
                task.cancel()

    async def _step(self, api: BatchApi) -> bool:
        """Renew, expire, claim what this replica has room for, finalize, delete expired files; whether any line
        was claimed."""
        settings, store = api.settings, api.store
        if time.monotonic() - self._renewed > settings.lease_s / 3:
            await asyncio.to_thread(store.renew, self._owner, settings.lease_s)
            self._renewed = time.monotonic()
        for tenant, ended in await asyncio.to_thread(store.expire, int(time.time())):
            self._metrics.batch_lines.labels(tenant, "expired").inc(ended)
        free = settings.concurrency - len(self._running)
        claimed = await asyncio.to_thread(store.claim, self._owner, free, settings.lease_s) if free > 0 else []
        for line in claimed:
            task = asyncio.create_task(self._run(api, line))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        for batch_id in await asyncio.to_thread(store.to_finalize):
            await self._finalize(api, batch_id)
        if expired := await asyncio.to_thread(store.expired_files, int(time.time())):
            for file_id in expired:
                await asyncio.to_thread(api.contents.delete, file_id)
            await asyncio.to_thread(store.forget_files, expired)
        return bool(claimed)

    async def _run(self, api: BatchApi, line: Claimed) -> None:
        started = time.monotonic()
        try:
            status, body, request_id = await self._run_line(line.tenant, line.key_id, line.endpoint, line.request,
                                                            line.batch_id)
        except Exception:
            log.exception("batch %s line %d could not be run", line.batch_id, line.line_no)
            status, body, request_id = 500, b'{"error": {"message": "internal error in the gateway"}}', ""
        try:
            answer = json.loads(body)
        except ValueError:
            answer = {"error": {"message": body.decode(errors="replace")}}
        error = answer.get("error") if isinstance(answer, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        if status == 503 and code in _WAIT_CODES:
            await self._retry(api, line, False, 0.0)
            return
        if status in _RETRIED and line.attempts + 1 < api.settings.max_attempts:
            delay = min(api.settings.retry_backoff_s * 2 ** line.attempts, _MAX_BACKOFF_S) * random.uniform(0.5, 1)
            await self._retry(api, line, True, delay)
            self._metrics.batch_retries.labels(line.tenant).inc()
            return
        ok = 200 <= status < 300
        result = {"id": line_id(line.batch_id, line.line_no), "custom_id": line.custom_id,
                  "response": {"status_code": status, "request_id": request_id, "body": answer}, "error": None}
        if await self._record(api, line, ok, result):
            self._metrics.batch_lines.labels(line.tenant, "completed" if ok else "failed").inc()
            self._metrics.batch_line_seconds.observe(time.monotonic() - started)

    async def _record(self, api: BatchApi, line: Claimed, ok: bool, result: dict[str, Any]) -> bool:
        """Whether the line's answer was recorded (False: its lease had passed to another replica)."""
        recorded = asyncio.get_running_loop().create_future()
        self._answers.append((line, ok, result, recorded))
        if self._recorder is None or self._recorder.done():
            self._recorder = asyncio.create_task(self._record_waiting(api))
        return await recorded

    async def _record_waiting(self, api: BatchApi) -> None:
        while self._answers:
            answers, self._answers = self._answers, []
            try:
                done = await asyncio.to_thread(api.store.finish, self._owner, [a[:3] for a in answers])
            except Exception as exc:  # each line's task sees it, as it would have from its own write
                for *_, recorded in answers:
                    if not recorded.done():
                        recorded.set_exception(exc)
                continue
            for (*_, recorded), was in zip(answers, done):
                if not recorded.done():
                    recorded.set_result(was)

    async def _retry(self, api: BatchApi, line: Claimed, counted: bool, delay_s: float) -> None:
        ended = await asyncio.to_thread(api.store.retry, line, self._owner, counted, delay_s)
        if ended is not None:
            self._metrics.batch_lines.labels(line.tenant, ended).inc()

    async def _finalize(self, api: BatchApi, batch_id: str) -> None:
        """Write the output and error files, then end the batch; run again from the start, it writes the same."""
        store = api.store
        tenant, output_ttl_s = await asyncio.to_thread(store.owner_of, batch_id)
        now = int(time.time())
        batch = await asyncio.to_thread(store.batch, tenant, batch_id)
        if batch is None:
            return
        if batch["status"] == "in_progress":
            await asyncio.to_thread(store.update, tenant, batch_id, status="finalizing", finalizing_at=now)
        results = await asyncio.to_thread(store.results, batch_id)
        ended: dict[str, Any] = {}
        for ok, name in ((True, "output"), (False, "error")):
            lines = [result for result_ok, result in results if result_ok is ok]
            if not lines:
                continue
            content = "".join(json.dumps(line) + "\n" for line in lines).encode()
            file_id = f"file-{batch_id.removeprefix('batch_')}-{name}"
            record = {"id": file_id, "filename": f"{batch_id}_{name}.jsonl", "purpose": "batch_output",
                      "bytes": len(content), "created_at": now, "expires_at": now + output_ttl_s}
            await asyncio.to_thread(api.contents.write, file_id, content)
            await asyncio.to_thread(store.add_file, record, tenant)
            ended[f"{name}_file_id"] = file_id
        if batch["cancelling_at"]:
            ended.update(status="cancelled", cancelled_at=now)
        elif batch["expired_at"]:
            ended.update(status="expired")
        else:
            ended.update(status="completed", completed_at=now)
        await asyncio.to_thread(store.update, tenant, batch_id, **ended)
