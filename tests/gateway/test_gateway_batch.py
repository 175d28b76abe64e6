"""OpenAI's Files and Batches API at the gateway, through the official client, in front of a real runtime: chat
and embeddings batches end to end, each tenant's own files and batches, validation, the quota of enqueued tokens,
retries, metrics, cancel and expiry; and the store on SQLite and on a real PostgreSQL: leases, the quota's
transaction, and gateways killed (SIGKILL) several times during one batch, which still answers every custom_id
exactly once."""
import contextlib
import io
import json
import sqlite3
import threading
import time

import httpx
import openai
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, run_gateway, table
from fixtures.postgres import start_postgres
from sluice_contracts.routing_table import RoutingTable
from sluice_gateway.batch.line_cost import line_tokens
from sluice_gateway.batch.store import BatchStore, Line, QuotaExceeded

pytestmark = pytest.mark.integration

ALICE, BOB, CAROL, ERIN = "sk-batch-alice", "sk-batch-bob", "sk-batch-carol", "sk-batch-erin"


def _batch_line_ids(gateway, batch_id):
    return {line["request_id"] for line in gateway.log_lines() if line.get("client_request_id") == batch_id}


def config(tmp, **batch):
    return gateway_config([
        {"name": "alice", "keys": [key_entry("alice-key", ALICE)], "limits": {"requests_per_minute": 2}},
        {"name": "bob", "keys": [key_entry("bob-key", BOB)]},
        {"name": "carol", "keys": [key_entry("carol-key", CAROL)], "models": ["other-*"]},
        {"name": "erin", "keys": [key_entry("erin-key", ERIN)], "limits": {"batch_file_bytes": 2500}},
    ], shutdown={"ready_grace_s": 0}, batch={"database": str(tmp / "batch.sqlite3"), "files_dir": str(tmp / "files"), "lease_s": 2,
              "max_file_lines": 50, "max_file_bytes": 64 * 1024, **batch})


@pytest.fixture(scope="module")
def routes(tiny_runtimes):
    return table(tiny={"backends": [backend("tiny-v1", tiny_runtimes[0].url)]},
                 sleepy={"backends": [backend("sleepy-v1")]})  # scaled to zero until a test gives it an endpoint


@pytest.fixture(scope="module")
def gateway(routes, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("batch-gateway")
    # A few lines at once, so that a batch of a dozen has lines running and lines queued when a runtime dies.
    with run_gateway(config(workdir, concurrency=4), routes, workdir) as gw:
        yield gw


def client(gateway, key=ALICE):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=60)


def chat_line(custom_id, text="Say hi.", **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 3, **body}}


def upload(api, lines):
    content = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    return api.files.create(file=("input.jsonl", io.BytesIO(content.encode())), purpose="batch")


def wait_done(api, batch_id, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        batch = api.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(0.2)


def lines_of(api, file_id):
    if file_id is None:
        return []
    return [json.loads(line) for line in api.files.content(file_id).text.splitlines()]


def test_a_chat_batch_runs_every_line_once_outside_the_online_limits(gateway):
    alice = client(gateway)
    lines = [chat_line(f"q{n}", f"Count to {n}.") for n in range(6)]
    lines.append(chat_line("bad", max_tokens=-1))  # the endpoint refuses it: an error-file line, the rest runs
    uploaded = upload(alice, lines)
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    assert uploaded.id in [f.id for f in alice.files.list()]
    assert alice.files.retrieve(uploaded.id).filename == "input.jsonl"
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h", metadata={"job": "nightly"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"job": "nightly"}
    done = wait_done(alice, batch.id)
    assert done.status == "completed" and done.completed_at >= done.created_at
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (7, 6, 1)
    output, errors = lines_of(alice, done.output_file_id), lines_of(alice, done.error_file_id)
    assert [line["custom_id"] for line in output] == [f"q{n}" for n in range(6)]
    for line in output:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert line["response"]["body"]["choices"][0]["message"]["content"] is not None
    assert [(line["custom_id"], line["response"]["status_code"]) for line in errors] == [("bad", 400)]
    # Seven lines ran for a tenant allowed two requests a minute; its online traffic still has both.
    for _ in range(2):
        alice.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    # Each line has its own request id, and its batch's id, in the access log.
    request_ids = [line["response"]["request_id"] for line in output]
    logged = gateway.access_lines(*request_ids)
    assert len(set(request_ids)) == 6
    assert {(line["batch_id"], line["client_request_id"]) for line in logged.values()} == {(batch.id, batch.id)}
    assert {line["tenant"] for line in logged.values()} == {"alice"}
    assert batch.id in [b.id for b in alice.batches.list(limit=100)]
    assert gateway.metric("sluice_gateway_batch_lines_total", tenant="alice", outcome="completed") >= 6
    assert gateway.metric("sluice_gateway_batch_lines_total", tenant="alice", outcome="failed") >= 1
    assert gateway.metric("sluice_gateway_batch_line_seconds_count") >= 7
    assert gateway.metric("sluice_gateway_batches", state="completed") >= 1


def test_an_embeddings_batch(gateway):
    bob = client(gateway, BOB)
    lines = [{"custom_id": f"e{n}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "tiny", "input": f"document {n}"}} for n in range(3)]
    batch = bob.batches.create(input_file_id=upload(bob, lines).id, endpoint="/v1/embeddings",
                               completion_window="24h", output_expires_after={"anchor": "created_at", "seconds": 7200})
    done = wait_done(bob, batch.id)
    assert done.status == "completed" and done.error_file_id is None
    produced = bob.files.retrieve(done.output_file_id)
    assert produced.expires_at == produced.created_at + 7200
    output = lines_of(bob, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == ["e0", "e1", "e2"]
    assert all(len(line["response"]["body"]["data"][0]["embedding"]) > 0 for line in output)


def test_a_completions_batch(gateway):
    bob = client(gateway, BOB)
    lines = [{"custom_id": "p0", "method": "POST", "url": "/v1/completions",
              "body": {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3}}]
    batch = bob.batches.create(input_file_id=upload(bob, lines).id, endpoint="/v1/completions",
                               completion_window="24h")
    done = wait_done(bob, batch.id)
    assert done.status == "completed"
    [line] = lines_of(bob, done.output_file_id)
    assert line["custom_id"] == "p0" and line["response"]["body"]["usage"]["completion_tokens"] <= 3


def test_another_tenants_files_and_batches_are_not_found(gateway):
    alice, bob = client(gateway), client(gateway, BOB)
    uploaded = upload(alice, [chat_line("only")])
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
    for call in (lambda: bob.files.retrieve(uploaded.id), lambda: bob.files.content(uploaded.id),
                 lambda: bob.files.delete(uploaded.id), lambda: bob.batches.retrieve(batch.id),
                 lambda: bob.batches.cancel(batch.id),
                 lambda: bob.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                            completion_window="24h"),
                 lambda: bob.files.retrieve("file-unknown")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert uploaded.id not in [f.id for f in bob.files.list()]
    assert batch.id not in [b.id for b in bob.batches.list()]
    wait_done(alice, batch.id)
    assert alice.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        alice.files.content(uploaded.id)


@pytest.mark.parametrize(("line", "code"), [
    ("{not json", "invalid_json_line"),
    ({**chat_line("x"), "url": "/v1/completions"}, "invalid_url"),
    ({**chat_line("x"), "method": "GET"}, "invalid_method"),
    (chat_line("first"), "duplicate_custom_id"),
    ({"method": "POST", "url": "/v1/chat/completions", "body": {"model": "tiny"}}, "missing_required_parameter"),
    (chat_line("s", stream=True), "invalid_request"),
])
def test_a_bad_line_fails_the_batch_naming_it(gateway, line, code):
    bob = client(gateway, BOB)
    batch = bob.batches.create(input_file_id=upload(bob, [chat_line("first"), line]).id,
                               endpoint="/v1/chat/completions", completion_window="24h")
    failed = wait_done(bob, batch.id)
    assert failed.status == "failed" and failed.failed_at and failed.output_file_id is None
    assert [(e.code, e.line) for e in failed.errors.data] == [(code, 2)]


def test_a_model_the_tenant_may_not_use_fails_the_batch(gateway):
    carol = client(gateway, CAROL)
    batch = carol.batches.create(input_file_id=upload(carol, [chat_line("c")]).id,
                                 endpoint="/v1/chat/completions", completion_window="24h")
    failed = wait_done(carol, batch.id)
    assert failed.status == "failed" and [(e.code, e.line) for e in failed.errors.data] == [("model_not_found", 1)]


def test_bad_requests_get_openai_errors(gateway):
    bob = client(gateway, BOB)
    with pytest.raises(openai.APIStatusError) as too_many:
        upload(bob, [chat_line(f"n{n}") for n in range(51)])
    assert too_many.value.status_code == 413
    with pytest.raises(openai.APIStatusError) as too_big:
        upload(bob, [chat_line("big", "x" * 70 * 1024)])
    assert too_big.value.status_code == 413
    with pytest.raises(openai.BadRequestError):
        bob.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    uploaded = upload(bob, [chat_line("w")])
    for kwargs in ({"completion_window": "1h"}, {"endpoint": "/v1/rerank"}, {"metadata": {"k": 1}}):
        with pytest.raises(openai.BadRequestError):
            bob.batches.create(**{"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions",
                                  "completion_window": "24h", **kwargs})
    with pytest.raises(openai.BadRequestError):
        bob.batches.list(limit=1000)
    answer = httpx.post(f"{gateway.url}/v1/batches", content=b"[1", headers={"authorization": f"Bearer {BOB}"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json"
    assert httpx.get(f"{gateway.url}/v1/files").status_code == 401


def test_batches_are_listed_newest_first_by_pages(gateway):
    bob = client(gateway, BOB)
    uploaded = upload(bob, ["{broken"])  # fails at once: the listing is what is tested
    made = [bob.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                               completion_window="24h").id for _ in range(3)]
    first = bob.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    rest = bob.batches.list(limit=2, after=first.data[-1].id)
    assert rest.data[0].id == made[0]


@pytest.fixture(scope="module")
def one_line_at_a_time(routes, tmp_path_factory):
    """A gateway that runs one batch line at a time, so that batches are caught part-way through."""
    workdir = tmp_path_factory.mktemp("batch-serial")
    settings = {**config(workdir, concurrency=1, max_attempts=1), "cold_start": {"max_wait_s": 0.5}}
    with run_gateway(settings, routes, workdir) as gw:
        yield gw, workdir


def _part_run(api, custom_prefix, count=30):
    lines = [chat_line(f"{custom_prefix}{n}", max_tokens=12) for n in range(count)]
    batch = api.batches.create(input_file_id=upload(api, lines).id, endpoint="/v1/chat/completions",
                               completion_window="24h")
    while api.batches.retrieve(batch.id).request_counts.completed < 1:
        time.sleep(0.02)
    return batch


def _check_partial(api, done, custom_prefix, code, count=30):
    counts = done.request_counts
    assert counts.completed >= 1 and counts.failed >= count // 2 and counts.completed + counts.failed == count
    output, errors = lines_of(api, done.output_file_id), lines_of(api, done.error_file_id)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(f"{custom_prefix}{n}" for n in range(count))
    assert {line["error"]["code"] for line in errors} == {code}


def test_a_cancelled_batch_stops_its_lines_not_yet_started(one_line_at_a_time):
    alice = client(one_line_at_a_time[0], ALICE)
    batch = _part_run(alice, "c")
    cancelling = alice.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = wait_done(alice, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    _check_partial(alice, done, "c", "batch_cancelled")


def test_a_batch_past_its_window_ends_expired_with_what_completed(one_line_at_a_time):
    gateway, workdir = one_line_at_a_time
    bob = client(gateway, BOB)
    batch = _part_run(bob, "x")
    # Its 24 hours pass: the stored deadline is moved, as no test can wait for the clock.
    BatchStore(str(workdir / "batch.sqlite3")).update("bob", batch.id, expires_at=0)
    done = wait_done(bob, batch.id)
    assert done.status == "expired" and done.expired_at
    _check_partial(bob, done, "x", "batch_expired")


def test_one_tenants_long_batch_does_not_hold_back_anothers(one_line_at_a_time):
    gateway, _ = one_line_at_a_time
    bob, alice = client(gateway, BOB), client(gateway, ALICE)
    long = bob.batches.create(input_file_id=upload(bob, [chat_line(f"l{n}") for n in range(30)]).id,
                              endpoint="/v1/chat/completions", completion_window="24h")
    short = alice.batches.create(input_file_id=upload(alice, [chat_line("s0"), chat_line("s1")]).id,
                                 endpoint="/v1/chat/completions", completion_window="24h")
    assert wait_done(alice, short.id).status == "completed"
    assert bob.batches.retrieve(long.id).request_counts.completed < 20
    assert wait_done(bob, long.id).status == "completed"


def test_a_batch_waits_for_its_model_to_start_without_using_up_its_attempts(one_line_at_a_time, routes,
                                                                            tiny_runtimes):
    gateway, _ = one_line_at_a_time
    bob = client(gateway, BOB)
    lines = [{**chat_line(f"z{n}"), "body": {**chat_line("")["body"], "model": "sleepy"}} for n in range(2)]
    batch = bob.batches.create(input_file_id=upload(bob, lines).id, endpoint="/v1/chat/completions",
                               completion_window="24h")
    time.sleep(2)  # each line held past cold_start.max_wait_s a few times, with one attempt allowed
    waiting = bob.batches.retrieve(batch.id)
    assert waiting.status == "in_progress" and waiting.request_counts.failed == 0
    started = json.loads(json.dumps(routes))
    started["generation"] += 1
    started["routes"]["sleepy"]["backends"][0]["endpoints"] = [tiny_runtimes[0].url]
    gateway.write_routes(started)
    done = wait_done(bob, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 2


def test_the_batch_settings_are_checked_and_their_paths_follow_the_config(tmp_path):
    from sluice_gateway.config import ConfigError, load_config

    path = tmp_path / "gateway.yaml"
    path.write_text("batch: {priority_class: bulk}\n")
    with pytest.raises(ConfigError, match="batch.priority_class 'bulk' is not one of the classes"):
        load_config(path)
    path.write_text("batch: {max_file_lines: 0}\n")
    with pytest.raises(ConfigError, match="batch.max_file_lines"):
        load_config(path)
    path.write_text("batch: {files_dir: /srv/batch}\n")
    settings = load_config(path).batch
    assert (settings.database, str(settings.files_dir)) == (str(tmp_path / "sluice-batch.sqlite3"), "/srv/batch")
    path.write_text("batch: {database: 'postgresql://batch@db:5432/sluice'}\n")
    assert load_config(path).batch.database == "postgresql://batch@db:5432/sluice"
    path.write_text("batch: {database: 'mysql://db/sluice'}\n")
    with pytest.raises(ConfigError, match="a SQLite file's path or a postgresql:// URL"):
        load_config(path)
    path.write_text("tenants: [{name: t, keys: [{id: k, sha256: '%s'}], limits: {batch_enqueued_tokens: 0}}]\n" % ("0" * 64))
    with pytest.raises(ConfigError, match="batch_enqueued_tokens"):
        load_config(path)


def test_batch_lines_run_at_the_least_urgent_class_unless_one_is_named(tmp_path):
    from sluice_gateway.config import load_config

    path = tmp_path / "gateway.yaml"
    path.write_text("")
    assert load_config(path).batch_priority_class == "batch"
    # Own classes without one named `batch`: the config stays valid, and batch lines take the least urgent.
    path.write_text("priority: {classes: {gold: -5, bronze: 5}, default_class: gold}\n")
    assert load_config(path).batch_priority_class == "bronze"
    path.write_text("priority: {classes: {gold: -5, bronze: 5}, default_class: gold}\nbatch: {priority_class: gold}\n")
    assert load_config(path).batch_priority_class == "gold"


# -- file expiry and storage -----------------------------------------------------------------------------------
def test_files_expire_and_a_tenants_files_stay_within_its_storage_quota(gateway):
    erin = client(gateway, ERIN)

    def put(size, **policy):
        return erin.files.create(file=("f.jsonl", io.BytesIO(b"x" * size)), purpose="batch", **policy)

    hour = put(1000, expires_after={"anchor": "created_at", "seconds": 3600})
    assert hour.expires_at == hour.created_at + 3600
    month = put(500)  # OpenAI's default for batch files: 30 days
    assert month.expires_at == month.created_at + 30 * 24 * 3600
    # Two uploads at once with room for one (2,500 bytes in all): one is stored, the other refused.
    answers: list = []

    def upload_one():
        try:
            answers.append(put(600))
        except openai.APIStatusError as exc:
            answers.append(exc)

    threads = [threading.Thread(target=upload_one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    refused = [a for a in answers if isinstance(a, Exception)]
    assert len(refused) == 1 and refused[0].status_code == 429
    assert refused[0].body["code"] == "storage_limit_exceeded"
    with pytest.raises(openai.BadRequestError) as alone:
        put(2600)
    assert alone.value.body["code"] == "storage_limit_exceeded"
    for policy in ({"anchor": "last_active_at", "seconds": 3600}, {"anchor": "created_at", "seconds": 60}):
        with pytest.raises(openai.BadRequestError):
            put(10, expires_after=policy)
    with pytest.raises(openai.BadRequestError):
        erin.batches.create(input_file_id=month.id, endpoint="/v1/chat/completions", completion_window="24h",
                            output_expires_after={"anchor": "created_at", "seconds": 10 ** 9})
    # The hour passes (moved in the store, as no test can wait for the clock): the file is gone as a deleted one,
    # its bytes count no more, and its contents leave the volume.
    with contextlib.closing(sqlite3.connect(gateway.config_path.parent / "batch.sqlite3")) as db, db:
        db.execute("UPDATE files SET expires_at = 0 WHERE id = ?", (hour.id,))
    for call in (lambda: erin.files.retrieve(hour.id), lambda: erin.files.content(hour.id),
                 lambda: erin.files.delete(hour.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert hour.id not in [f.id for f in erin.files.list()]
    put(900)
    deadline = time.monotonic() + 10
    while (gateway.config_path.parent / "files" / hour.id).exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)


# -- the quota of enqueued batch tokens -------------------------------------------------------------------------
DAVE = "sk-batch-dave"
_PARKED = {"parked": {"backends": [backend("parked-v1", max_model_len=2048)]},  # no endpoint: its lines wait
           "unbounded": {"backends": [backend("unbounded-v1")]}}  # no endpoint, no known context
_QUOTA_LINES = 4


def parked_line(custom_id, model="parked", **body):
    return {**chat_line(custom_id), "body": {**chat_line(custom_id)["body"], "model": model, "max_tokens": 100,
                                             **body}}


def parked_batch(api, prefix, count=_QUOTA_LINES, **body):
    return api.batches.create(input_file_id=upload(api, [parked_line(f"{prefix}{n}", **body)
                                                         for n in range(count)]).id,
                              endpoint="/v1/chat/completions", completion_window="24h")


@pytest.fixture(scope="module")
def quota_gateway(routes, tmp_path_factory):
    """Dave may have one batch of parked lines enqueued at a time, not two; a line's cost is read with the
    gateway's own ruler (what online limits count), so the test does not depend on its constants."""
    workdir = tmp_path_factory.mktemp("batch-quota")
    parked = table(**routes["routes"], **_PARKED)
    line = parked_line("x")
    cost = line_tokens(line["body"], "chat", "/v1/chat/completions", RoutingTable.model_validate(parked),
                       lambda _: True, 512)
    quota = cost * _QUOTA_LINES * 3 // 2
    assert quota < 2048  # a line without max_tokens, reserved to the end of its context, is over it alone
    settings = {**config(workdir), "cold_start": {"max_wait_s": 0.5}}
    settings["tenants"].append({"name": "dave", "keys": [key_entry("dave-key", DAVE)], "models": ["*"],
                                "limits": {"batch_enqueued_tokens": quota, "requests_per_minute": 1}})
    with run_gateway(settings, parked, workdir) as gw:
        yield gw, cost


def test_a_tenants_unfinished_batches_stay_within_its_quota_of_enqueued_tokens(quota_gateway):
    gateway, cost = quota_gateway
    dave = client(gateway, DAVE)
    # Two batches made at once, each within the quota alone: one is taken, the other refused, whichever was
    # still being validated when the first was stored.
    answers: list = []

    def make(prefix):
        try:
            answers.append(parked_batch(dave, prefix))
        except openai.APIStatusError as exc:
            answers.append(exc)

    threads = [threading.Thread(target=make, args=(prefix,)) for prefix in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    taken = [a for a in answers if not isinstance(a, Exception)]
    refused = [a for a in answers if isinstance(a, Exception)]
    assert len(taken) == 1 and len(refused) == 1
    assert refused[0].status_code == 429 and refused[0].body["code"] == "token_limit_exceeded"
    first = taken[0]
    assert gateway.metric("sluice_gateway_batch_enqueued_tokens", tenant="dave") == cost * _QUOTA_LINES
    # Still refused while the first waits; a line without max_tokens, or with a huge one where no context is
    # known, is over the quota alone: 400, as retrying cannot help.
    with pytest.raises(openai.RateLimitError):
        parked_batch(dave, "c")
    for body in ({"max_tokens": None}, {"max_tokens": 10 ** 9, "model": "unbounded"}):
        with pytest.raises(openai.BadRequestError) as alone:
            parked_batch(dave, "d", count=1, **body)
        assert alone.value.body["code"] == "token_limit_exceeded"
    # A huge max_tokens where the context is known costs nothing: its line is refused before it could run.
    huge = parked_batch(dave, "h", count=1, max_tokens=10 ** 9)
    assert wait_done(dave, huge.id).request_counts.failed == 1
    [refusal] = lines_of(dave, wait_done(dave, huge.id).error_file_id)
    assert refusal["response"]["body"]["error"]["code"] == "context_length_exceeded"
    # The batch lines do not touch dave's one request a minute.
    dave.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    # Cancelled, the first batch hands its tokens back (its running lines end when they come back from their
    # hold), and a new batch is taken.
    dave.batches.cancel(first.id)
    assert wait_done(dave, first.id).status == "cancelled"
    assert gateway.metric("sluice_gateway_batch_enqueued_tokens", tenant="dave") == 0
    again = parked_batch(dave, "e")
    assert gateway.metric("sluice_gateway_batches", state="cancelled") >= 1
    assert gateway.metric("sluice_gateway_batches", state="in_progress") == 1
    assert gateway.metric("sluice_gateway_batch_lines_total", tenant="dave", outcome="cancelled") >= 1
    time.sleep(1)
    assert gateway.metric("sluice_gateway_batch_queue_age_seconds") >= 1
    dave.batches.cancel(again.id)
    wait_done(dave, again.id)


# -- retries ----------------------------------------------------------------------------------------------------
def test_a_line_whose_attempts_keep_failing_is_tried_a_bounded_number_of_times(routes, tmp_path):
    # Every answer is larger than the gateway passes on: each attempt ends in a 502.
    settings = {**config(tmp_path, max_attempts=3, retry_backoff_s=0.3), "max_response_bytes": 64}
    with run_gateway(settings, routes, tmp_path) as gateway:
        bob = client(gateway, BOB)
        started = time.monotonic()
        batch = bob.batches.create(input_file_id=upload(bob, [chat_line("r0"), chat_line("r1")]).id,
                                   endpoint="/v1/chat/completions", completion_window="24h")
        done = wait_done(bob, batch.id)
        assert done.status == "completed" and done.request_counts.failed == 2
        errors = lines_of(bob, done.error_file_id)
        assert sorted(line["custom_id"] for line in errors) == ["r0", "r1"]
        assert {line["response"]["status_code"] for line in errors} == {502}
        # Three attempts each, the later ones after a backoff of at least half of 0.3 s, then of 0.6 s.
        assert len(_batch_line_ids(gateway, batch.id)) == 6
        assert time.monotonic() - started >= 0.45
        assert gateway.metric("sluice_gateway_batch_retries_total", tenant="bob") == 4


def test_lines_whose_runtime_is_killed_mid_batch_are_retried_and_each_answered_once(gateway, routes, spare_runtime,
                                                                                  tiny_runtimes):
    spare = json.loads(json.dumps(routes))
    spare["generation"] += 1
    spare["routes"]["spare"] = {"backends": [backend("spare-v1", spare_runtime.url)]}
    gateway.write_routes(spare)
    bob = client(gateway, BOB)
    lines = [{**chat_line(f"s{n}"), "body": {**chat_line("", f"Tell a story about {n}.")["body"], "model": "spare",
                                             "max_tokens": 24}} for n in range(12)]
    deadline = time.monotonic() + 30
    while True:  # until the gateway has the new table
        with contextlib.suppress(openai.NotFoundError):
            bob.models.retrieve("spare")
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    batch = bob.batches.create(input_file_id=upload(bob, lines).id, endpoint="/v1/chat/completions",
                               completion_window="24h")
    while bob.batches.retrieve(batch.id).request_counts.completed < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    spare_runtime.process.kill()
    deadline = time.monotonic() + 30
    while gateway.metric("sluice_gateway_batch_retries_total", tenant="bob") < 1:
        assert time.monotonic() < deadline, "no line was handed back after the kill"
        time.sleep(0.05)
    spare["generation"] += 1
    spare["routes"]["spare"]["backends"][0]["endpoints"] = [tiny_runtimes[0].url]
    gateway.write_routes(spare)
    done = wait_done(bob, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 12
    output = lines_of(bob, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(line["custom_id"] for line in lines)
    answered = [line["request_id"] for line in gateway.log_lines()
                if line.get("client_request_id") == batch.id and line.get("status") == 200]
    assert sorted(answered) == sorted(line["response"]["request_id"] for line in output)


def test_the_database_url_may_come_from_a_file_and_one_that_holds_none_is_an_openai_error(routes, postgres,
                                                                                          tmp_path):
    url_file = tmp_path / "database-url"  # as a mounted Secret is
    url_file.write_text(postgres.new_database().replace("@", ":secret-word@", 1) + "\n")
    settings = config(tmp_path)
    del settings["batch"]["database"]
    settings["batch"]["database_file"] = str(url_file)
    with run_gateway(settings, routes, tmp_path / "url") as gateway:
        bob = client(gateway, BOB)
        batch = bob.batches.create(input_file_id=upload(bob, [chat_line("one")]).id,
                                   endpoint="/v1/chat/completions", completion_window="24h")
        assert wait_done(bob, batch.id).status == "completed"
        url_file.write_text("batch.sqlite3\n")  # the Secret rotated to something that is no URL
        gateway.process.kill()
        gateway.process.wait()
    with run_gateway(settings, routes, tmp_path / "no-url") as gateway:
        with pytest.raises(openai.InternalServerError) as down:
            client(gateway, BOB).batches.retrieve(batch.id)
        assert down.value.status_code == 503 and down.value.body["code"] == "batch_store_unavailable"
        assert f"{url_file}: its first line is not a postgresql:// URL" in gateway.log_text()
        assert "secret-word" not in gateway.log_text()


# -- the store on SQLite and on PostgreSQL ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def postgres():
    with start_postgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path):
    """A store location nothing else uses, on each backend."""
    if request.param == "sqlite":
        return str(tmp_path / "batch.sqlite3")
    return request.getfixturevalue("postgres").new_database()


def _batch(batch_id, created_at=1):
    return {"id": batch_id, "object": "batch", "endpoint": "/v1/chat/completions", "status": "in_progress",
            "created_at": created_at, "expires_at": created_at + 24 * 3600, "cancelling_at": None, "expired_at": None}


def _lines(count, tokens=10):
    return [Line(f"c{n}", {"model": "tiny", "messages": [{"role": "user", "content": str(n)}]}, tokens)
            for n in range(count)]


def test_a_lease_not_renewed_passes_to_another_replica_and_the_late_answer_is_dropped(database):
    store = BatchStore(database)
    store.add_batch(_batch("batch_a"), "alice", "alice-key", _lines(3), None, 3600)
    first = store.claim("replica-1", 2, lease_s=0.3)
    assert [line.custom_id for line in first] == ["c0", "c1"]
    assert [line.custom_id for line in store.claim("replica-2", 5, lease_s=0.3)] == ["c2"]
    time.sleep(0.4)  # replica-1 stopped renewing
    store.renew("replica-2", 30)
    taken = store.claim("replica-2", 5, lease_s=30)
    assert [line.custom_id for line in taken] == ["c0", "c1"]
    assert store.finish("replica-1", [(first[0], True, {"late": True})]) == [False]
    # Answers recorded together are judged one by one: c0 written twice in one transaction is kept once.
    assert store.finish("replica-2", [(taken[0], True, {"custom_id": "c0"}),
                                      (taken[0], True, {"custom_id": "c0", "again": True})]) == [True, False]
    store.retry(taken[1], "replica-2", True, delay_s=30)  # back off: not claimable for 30 s
    assert store.claim("replica-3", 5, lease_s=30) == []
    assert store.batch("alice", "batch_a")["request_counts"] == {"total": 3, "completed": 1, "failed": 0}
    assert store.batch("bob", "batch_a") is None
    assert store.census().enqueued_tokens == {"alice": 20}


def test_batches_stored_at_once_cannot_pass_the_quota_together(database):
    stores = [BatchStore(database) for _ in range(4)]  # as four replicas would
    stores[0].add_batch(_batch("batch_seed"), "alice", "k", [], 100, 3600)  # the schema exists before the race
    outcomes: list[str] = []
    start = threading.Barrier(len(stores))

    def store_one(n):
        start.wait()
        try:
            stores[n].add_batch(_batch(f"batch_{n}"), "alice", "k", _lines(6), 100, 3600)
            outcomes.append("stored")
        except QuotaExceeded as over:
            outcomes.append(f"refused with {over.held} enqueued")

    threads = [threading.Thread(target=store_one, args=(n,)) for n in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused with 60 enqueued"] * 3 + ["stored"]
    # Another tenant's batch is not counted against this one's quota.
    stores[0].add_batch(_batch("batch_bob"), "bob", "k", _lines(6), 100, 3600)


def test_gateways_killed_during_a_batch_lose_no_line_and_answer_none_twice(database, routes, tmp_path):
    settings = config(tmp_path, concurrency=2)
    settings["batch"]["database"] = database
    lines = [chat_line(f"k{n}", f"Tell a story about {n}.", max_tokens=8) for n in range(24)]
    ran_by_killed: list[set[str]] = []
    for kill in range(3):
        with run_gateway(settings, routes, tmp_path / f"killed-{kill}") as gateway:
            alice = client(gateway, ALICE)
            if kill == 0:
                batch = alice.batches.create(input_file_id=upload(alice, lines).id,
                                             endpoint="/v1/chat/completions", completion_window="24h")
            target = alice.batches.retrieve(batch.id).request_counts.completed + 4
            deadline = time.monotonic() + 60
            while alice.batches.retrieve(batch.id).request_counts.completed < target:
                assert time.monotonic() < deadline, "no line answered after a restart"
                time.sleep(0.01)
            gateway.process.kill()
            gateway.process.wait()
            ran_by_killed.append(_batch_line_ids(gateway, batch.id))
    with run_gateway(settings, routes, tmp_path / "last") as gateway:
        alice = client(gateway, ALICE)
        done = wait_done(alice, batch.id)
        ran_by_last = _batch_line_ids(gateway, batch.id)
        output = lines_of(alice, done.output_file_id)
    assert done.status == "completed" and done.request_counts.completed == 24
    assert sorted(line["custom_id"] for line in output) == sorted(line["custom_id"] for line in lines)
    answered_by = {line["response"]["request_id"] for line in output}
    # Each killed gateway ran the lines it recorded, and at most the two it was running when killed (answered
    # upstream, not yet recorded); the last one ran only lines it recorded.
    for ran in ran_by_killed:
        assert len(ran & answered_by) >= 4 and len(ran - answered_by) <= 2
    assert ran_by_last <= answered_by
    assert sum(len(ran & answered_by) for ran in [*ran_by_killed, ran_by_last]) == 24


def test_a_database_that_cannot_be_reached_is_an_openai_error_not_a_crash(routes, tmp_path):
    settings = config(tmp_path)
    settings["batch"]["database"] = "postgresql://sluice:secret-word@127.0.0.1:1/sluice"  # nothing listens there
    with run_gateway(settings, routes, tmp_path) as gateway:
        with pytest.raises(openai.InternalServerError) as down:
            client(gateway, BOB).files.list()
        assert down.value.status_code == 503 and down.value.body["code"] == "batch_store_unavailable"
        assert gateway.metric("sluice_gateway_ready") == 1  # online traffic does not depend on it
        assert "secret-word" not in gateway.log_text() and "sluice:***@127.0.0.1:1" in gateway.log_text()


def _failures_of_racing_lists(store: BatchStore, racers: int) -> list[Exception]:
    failures: list[Exception] = []

    def list_files():
        try:
            store.files("alice")
        except sqlite3.Error as exc:
            failures.append(exc)

    threads = [threading.Thread(target=list_files) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


def test_requests_that_race_to_a_new_sqlite_store_all_succeed(tmp_path):
    # The first requests a gateway answers may all be the first to open its database file.
    for trial in range(100):
        assert _failures_of_racing_lists(BatchStore(str(tmp_path / f"race-{trial}.db")), racers=6) == []
