"""Prometheus metrics of the gateway (`sluice_gateway_…`), in a registry of its own, served on a port of
their own: they name tenants and backend addresses, which API clients have no business reading.

Label values come only from the config (tenants) and the routing table (routes, backends, endpoints), so
series stay bounded; endpoint series are removed when the endpoint leaves the table.
"""
from __future__ import annotations

import io
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric

from sluice_contracts import demand
from sluice_contracts.http_bounds import MAX_HEADER_BYTES, MAX_HEADER_COUNT, MAX_REQUEST_LINE_BYTES

from .batch.database import STORE_ERRORS
from .batch.store import BatchStore
from .client_protocol import HEADERS_TOO_LARGE, LINE_TOO_LONG, TOO_MANY_HEADERS

log = logging.getLogger("sluice_gateway")

_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
_SLOW = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_HOLD = (0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600)
# OpenAI's batch states, each reported (0 when none is in it) so that a dashboard's series never vanish.
_BATCH_STATES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                 "cancelled")


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            demand.REQUESTS, "Requests answered, by route, backend, tenant and HTTP status.",
            ["route", demand.BACKEND_LABEL, "tenant", "status"], registry=r,
        )
        self.overhead = Histogram(
            "sluice_gateway_overhead_seconds", "Time the gateway itself adds to a request.", buckets=_FAST, registry=r
        )
        self.upstream_latency = Histogram(
            "sluice_gateway_upstream_latency_seconds", "Upstream time to response headers.",
            ["route", "backend"], buckets=_SLOW, registry=r,
        )
        self.ttft = Histogram(
            "sluice_gateway_time_to_first_token_seconds", "Time to the first streamed event, as clients see it.",
            ["route", "backend"], buckets=_SLOW, registry=r,
        )
        self.tokens = Counter(
            "sluice_gateway_tokens", "Tokens by tenant and direction (prompt or completion).",
            ["tenant", "direction"], registry=r,
        )
        self.limit_rejections = Counter(
            "sluice_gateway_limit_rejections", "Requests refused by a tenant limit.", ["tenant", "limit"], registry=r
        )
        self.upstream_errors = Counter(
            "sluice_gateway_upstream_errors", "Failed upstream attempts by backend and kind.",
            ["backend", "kind"], registry=r,
        )
        self.retries = Counter(
            "sluice_gateway_retries", "Attempts on another endpoint before the first byte.", ["route"], registry=r
        )
        self.client_disconnects = Counter(
            "sluice_gateway_client_disconnects", "Requests whose client left before the response ended.", registry=r
        )
        self.responses_passed_through = Counter(
            "sluice_gateway_responses_passed_through", "Non-streaming answers passed on as they arrived, not held "
            "whole, because the answers held at once reached max_held_response_bytes.", registry=r,
        )
        self.in_flight = Gauge("sluice_gateway_requests_in_flight", "Requests being proxied now.", registry=r)
        self.priority_held = Gauge(
            "sluice_gateway_priority_held", "Requests of a less urgent class waiting for a replica with room.",
            ["priority_class"], registry=r,
        )
        self.priority_shed = Counter(
            "sluice_gateway_priority_shed", "Requests of a less urgent class answered 503 by the hold (full, or "
            "no replica with room in time, or within the request's budget).", ["priority_class"], registry=r,
        )
        self._declare_demand(r)
        self._declare_state(r)
        self._declare_batch(r)

    def _declare_demand(self, r: CollectorRegistry) -> None:
        """Scale to zero: what the operator reads (sluice_contracts.demand) and how long clients waited."""
        self.held_requests = Gauge(
            demand.HELD_REQUESTS, "Requests held now because the model has no endpoint (scaled to zero, starting).",
            [demand.BACKEND_LABEL], registry=r,
        )
        self.backend_in_flight = Gauge(
            demand.BACKEND_IN_FLIGHT, "Requests forwarded to the model and not yet answered in full.",
            [demand.BACKEND_LABEL], registry=r,
        )
        self.hold_seconds = Histogram(
            "sluice_gateway_hold_seconds",
            "Time a request was held for its model to start, by outcome: forwarded, timeout, deadline (its budget "
            "ran out), shutdown, client_left.",
            [demand.BACKEND_LABEL, "outcome"], buckets=_HOLD, registry=r,
        )
        self.hold_refusals = Counter(
            "sluice_gateway_hold_refusals",
            "Requests answered 503 while their model started, by reason: full, timeout, deadline, shutdown.",
            [demand.BACKEND_LABEL, "reason"], registry=r,
        )

    def _declare_state(self, r: CollectorRegistry) -> None:
        """What the gateway serves from: endpoints, files, readiness, the limiter's store."""
        self.endpoint_load = Gauge(
            "sluice_gateway_endpoint_load", "Endpoint load as last polled from its /load (or /metrics, for engines without one).",
            ["endpoint", "field"], registry=r,
        )
        self.endpoint_up = Gauge(
            "sluice_gateway_endpoint_up", "1 when the endpoint's last /load poll succeeded.", ["endpoint"], registry=r
        )
        self.table_generation = Gauge(
            "sluice_gateway_routing_table_generation", "Generation of the routing table in force.", registry=r
        )
        self.table_rejections = Counter(
            "sluice_gateway_routing_table_rejections", "Routing tables rejected as malformed.", registry=r
        )
        self.config_rejections = Counter(
            "sluice_gateway_config_rejections", "Gateway config files rejected as invalid.", registry=r
        )
        self.audit_write_failures = Counter(
            "sluice_gateway_audit_write_failures", "Audit records that could not be written (a full disk).",
            registry=r,
        )
        self.prompt_capture_write_failures = Counter(
            "sluice_gateway_prompt_capture_write_failures",
            "Prompt capture records that could not be written (a full disk, a file that cannot be opened).",
            registry=r,
        )
        self.file_rejected = Gauge(
            "sluice_gateway_file_rejected",
            "1 while the file on disk (config, routes, credential) is rejected; the last good one, if any, serves.",
            ["file"], registry=r,
        )
        self.ready = Gauge("sluice_gateway_ready", "1 while /ready answers 200.", registry=r)
        self.limiter_errors = Counter(
            "sluice_gateway_limiter_errors", "Rate-limit store failures (Redis unreachable).", registry=r
        )

    def _declare_batch(self, r: CollectorRegistry) -> None:
        """Batch lines this replica ran, and the batch store as a whole (the same on every replica that shares
        it: read it with max, not sum)."""
        self.batch_lines = Counter(
            "sluice_gateway_batch_lines", "Batch lines ended by this replica, by tenant and outcome: completed (a "
            "2xx), failed (another answer), cancelled or expired (stopped before they ran).",
            ["tenant", "outcome"], registry=r,
        )
        self.batch_retries = Counter(
            "sluice_gateway_batch_retries", "Batch line attempts that failed (429, 5xx, unreachable) and were handed "
            "back to be tried again after a backoff.", ["tenant"], registry=r,
        )
        self.batch_line_seconds = Histogram(
            "sluice_gateway_batch_line_seconds", "Time of a batch line's last attempt, holds included, until its "
            "answer was recorded.", buckets=_SLOW, registry=r,
        )
        self.batch_store: Callable[[], BatchStore | None] = lambda: None
        r.register(_BatchCensus(lambda: self.batch_store()))

    def forget_endpoint(self, url: str) -> None:
        for field in ("waiting", "running", "kv_cache_usage"):
            try:
                self.endpoint_load.remove(url, field)
            except KeyError:
                pass
        try:
            self.endpoint_up.remove(url)
        except KeyError:
            pass


class _BatchCensus:
    """Read from the batch store at each scrape: batches by state, the tokens each tenant's lines not yet done may
    cost (what its batch_enqueued_tokens limit counts), and how long the oldest line not yet answered has waited."""

    def __init__(self, store: Callable[[], BatchStore | None]) -> None:
        self._store = store

    def describe(self) -> list[Metric]:
        return []  # read at collection only: registering must not touch the store

    def collect(self) -> Iterator[Metric]:
        store = self._store()
        if store is None or not store.exists():
            return
        try:
            census = store.census()
        except STORE_ERRORS as exc:
            log.warning("batch metrics: the batch store cannot be read: %s", exc)
            return
        batches = GaugeMetricFamily("sluice_gateway_batches", "Batches in the store by state.", labels=["state"])
        for state in _BATCH_STATES:
            batches.add_metric([state], census.batches_by_state.get(state, 0))
        yield batches
        enqueued = GaugeMetricFamily("sluice_gateway_batch_enqueued_tokens", "Tokens the tenant's batch lines not "
                                     "yet answered may cost.", labels=["tenant"])
        for tenant, tokens in sorted(census.enqueued_tokens.items()):
            enqueued.add_metric([tenant], tokens)
        yield enqueued
        oldest = census.oldest_waiting_created_at
        yield GaugeMetricFamily("sluice_gateway_batch_queue_age_seconds", "Age of the oldest batch with a line "
                                "not yet answered; 0 when every line is.",
                                value=max(time.time() - oldest, 0) if oldest is not None else 0)


def serve_metrics(registry: CollectorRegistry, host: str, port: int, *, read_timeout_s: float) -> None:
    """Serve `registry` on http://host:port/metrics from a thread of this process (scrapes never wait on the
    event loop, and a busy loop still reports). A request's head is bounded as on the API port
    (`sluice_contracts.http_bounds`), and a client must send it within `read_timeout_s`."""
    handler = type("MetricsRequestHandler", (_BoundedHandler,), {"timeout": read_timeout_s})
    server_class = _MetricsServerV6 if ":" in host else _MetricsServer
    server = make_server(host, port, make_wsgi_app(registry), server_class, handler_class=handler)
    threading.Thread(target=server.serve_forever, name="sluice-metrics", daemon=True).start()


class _MetricsServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _MetricsServerV6(_MetricsServer):
    address_family = socket.AF_INET6




class _BoundedHandler(WSGIRequestHandler):
    """One scrape per connection; the head is read within the bounds, then handed to wsgiref as it was."""

    def handle(self) -> None:
        try:
            head = self._bounded_head()
        except OSError:  # the client was too slow (the socket timeout) or went away
            return
        if head is not None:
            self.rfile = io.BytesIO(head)  # /metrics is a GET: no body follows the head
            super().handle()

    def _bounded_head(self) -> bytes | None:
        line = self.rfile.readline(MAX_REQUEST_LINE_BYTES + 3)
        if not line:
            return None
        if len(line.rstrip(b"\r\n")) > MAX_REQUEST_LINE_BYTES or not line.endswith(b"\n"):
            self._refuse(LINE_TOO_LONG)
            return None
        lines, count, size = [line], 0, 0
        while True:
            header = self.rfile.readline(MAX_HEADER_BYTES - size + 5)  # its ": " and CRLF besides
            lines.append(header)
            if header in (b"\r\n", b"\n", b""):
                return b"".join(lines)
            count += 1
            if count > MAX_HEADER_COUNT:
                self._refuse(TOO_MANY_HEADERS)
                return None
            name, _, value = header.rstrip(b"\r\n").partition(b":")
            size += len(name) + len(value.strip())
            if size > MAX_HEADER_BYTES or not header.endswith(b"\n"):
                self._refuse(HEADERS_TOO_LARGE)
                return None

    def _refuse(self, response: bytes) -> None:
        self.wfile.write(response)
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the stdlib's name)
        """Scrapes are not logged."""
