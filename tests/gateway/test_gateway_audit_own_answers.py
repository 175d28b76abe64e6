"""Audit records of the requests the gateway answers itself (models, usage, admin, an unknown path, refusals
before any route), none for probes; and records that cannot be written are counted, the requests served."""
import json
import time

import httpx
import pytest

from fixtures.gateway import ADMIN_KEY, backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY = "sk-audit-olga"
ROUTES = table(chat={"backends": [backend("chat")]})  # no endpoint: nothing here reaches one


def config(sink: str) -> dict:
    return gateway_config([{"name": "olga", "keys": [key_entry("olga-ci", KEY)]}], audit={"sink": sink},
                          shutdown={"ready_grace_s": 0})


def records(path, count: int, timeout: float = 15) -> list[dict]:
    deadline = time.monotonic() + timeout
    while len(found := [r for r in map(json.loads, path.read_text().splitlines()) if r.get("audit") == "request"]) \
            < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} records: {found}"
        time.sleep(0.05)
    return found


def test_the_gateways_own_answers_have_records_and_probes_none(start_gateway):
    gateway = start_gateway(config("audit.jsonl"), ROUTES)
    tenant, admin = {"authorization": f"Bearer {KEY}"}, {"authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        for probe in ("/health", "/ready"):
            assert http.get(probe).status_code == 200
        answers = [
            http.get("/v1/models", headers={**tenant, "x-request-id": "listing"}),
            http.get("/v1/models", headers={"authorization": "Bearer sk-nobody"}),
            http.get("/v1/usage?start=0", headers=tenant),
            http.get("/admin/routes", headers=admin),
            http.get("/v1/no-such-path", headers=tenant),
        ]
    assert [a.status_code for a in answers] == [200, 401, 403, 200, 404]

    found = records(gateway.config_path.parent / "audit.jsonl", len(answers))
    assert len(found) == len(answers), "a probe got a record"
    by_path = {(r["path"], r["status"]): r for r in found}
    listing = by_path[("/v1/models", 200)]
    assert (listing["tenant"], listing["key_id"], listing["client_request_id"]) == ("olga", "olga-ci", "listing")
    assert listing["trace_id"] == answers[0].headers["x-sluice-trace-id"]
    assert listing["bytes_sent"] == len(answers[0].content) and listing["source"] == "127.0.0.1"
    assert listing["route"] is None and listing["error_code"] is None and listing["total_ms"] > 0
    refused = by_path[("/v1/models", 401)]
    assert refused["tenant"] is None and refused["key_id"] is None and refused["error_code"] == "invalid_api_key"
    assert by_path[("/v1/usage", 403)]["error_code"] == "admin_only"
    assert by_path[("/admin/routes", 200)]["key_id"] == "ops" and by_path[("/admin/routes", 200)]["tenant"] is None
    assert by_path[("/v1/no-such-path", 404)]["error_code"] == "unknown_url"
    assert "sk-nobody" not in (gateway.config_path.parent / "audit.jsonl").read_text()


def test_records_that_cannot_be_written_are_counted_and_the_requests_served(start_gateway):
    gateway = start_gateway(config("/dev/full"), ROUTES)  # every write fails: no space left
    before = gateway.metric("sluice_gateway_audit_write_failures_total")
    for _ in range(3):
        assert httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    assert gateway.metric("sluice_gateway_audit_write_failures_total") == before + 3
    assert "audit record not written" in gateway.log_text()
