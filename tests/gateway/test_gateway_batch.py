"""OpenAI's Files and Batches API at the gateway, through the official client, in front of a real runtime: chat
and embeddings batches end to end, each tenant's own files and batches, validation, limits, cancel, and a
gateway killed mid-batch that finishes every line exactly once after its restart."""
import contextlib
import io
import json
import sqlite3
import time

import httpx
import openai
import pytest

from fixtures.gateway import backend, gateway_config, key_entry, run_gateway, table

pytestmark = pytest.mark.integration

ALICE, BOB, CAROL = "sk-batch-alice", "sk-batch-bob", "sk-batch-carol"


def _batch_line_ids(gateway, batch_id):
    return {line["request_id"] for line in gateway.log_lines() if line.get("client_request_id") == batch_id}


def config(tmp, **batch):
    return gateway_config([
        {"name": "alice", "keys": [key_entry("alice-key", ALICE)], "limits": {"requests_per_minute": 2}},
        {"name": "bob", "keys": [key_entry("bob-key", BOB)]},
        {"name": "carol", "keys": [key_entry("carol-key", CAROL)], "models": ["other-*"]},
    ], shutdown={"ready_grace_s": 0}, batch={"database": str(tmp / "batch.sqlite3"), "files_dir": str(tmp / "files"), "lease_s": 2,
              "max_file_lines": 50, "max_file_bytes": 64 * 1024, **batch})


@pytest.fixture(scope="module")
def routes(tiny_runtimes):
    return table(tiny={"backends": [backend("tiny-v1", tiny_runtimes[0].url)]},
                 sleepy={"backends": [backend("sleepy-v1")]})  # scaled to zero until a test gives it an endpoint


@pytest.fixture(scope="module")
def gateway(routes, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("batch-gateway")
    with run_gateway(config(workdir), routes, workdir) as gw:
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
    assert {line["client_request_id"] for line in logged.values()} == {batch.id}
    assert {line["tenant"] for line in logged.values()} == {"alice"}
    assert batch.id in [b.id for b in alice.batches.list(limit=100)]


def test_an_embeddings_batch(gateway):
    bob = client(gateway, BOB)
    lines = [{"custom_id": f"e{n}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "tiny", "input": f"document {n}"}} for n in range(3)]
    batch = bob.batches.create(input_file_id=upload(bob, lines).id, endpoint="/v1/embeddings",
                               completion_window="24h")
    done = wait_done(bob, batch.id)
    assert done.status == "completed" and done.error_file_id is None
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


def test_a_gateway_killed_mid_batch_loses_no_line_and_repeats_none(routes, tmp_path):
    settings = config(tmp_path, concurrency=2)
    lines = [chat_line(f"k{n}", f"Tell a story about {n}.", max_tokens=12) for n in range(24)]
    with run_gateway(settings, routes, tmp_path / "first") as first:
        alice = client(first)
        batch = alice.batches.create(input_file_id=upload(alice, lines).id, endpoint="/v1/chat/completions",
                                     completion_window="24h")
        while alice.batches.retrieve(batch.id).request_counts.completed < 6:
            pass
        first.process.kill()
        first.process.wait()
        ran_first = _batch_line_ids(first, batch.id)
    with run_gateway(settings, routes, tmp_path / "second") as second:
        alice = client(second)
        done = wait_done(alice, batch.id)
        ran_second = _batch_line_ids(second, batch.id)
        output = lines_of(alice, done.output_file_id)
    assert done.status == "completed" and done.request_counts.completed == 24
    assert sorted(line["custom_id"] for line in output) == sorted(line["custom_id"] for line in lines)
    answered_by = {line["response"]["request_id"] for line in output}
    kept_from_first = answered_by & ran_first
    assert len(kept_from_first) >= 6
    # The restarted gateway ran exactly the lines whose answers the first had not recorded.
    assert ran_second <= answered_by and len(ran_second) == 24 - len(kept_from_first)


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
    with contextlib.closing(sqlite3.connect(workdir / "batch.sqlite3")) as db, db:
        db.execute("UPDATE batches SET body = json_set(body, '$.expires_at', 0) WHERE id = ?", (batch.id,))
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
    assert (settings.database, str(settings.files_dir)) == (tmp_path / "sluice-batch.sqlite3", "/srv/batch")


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
