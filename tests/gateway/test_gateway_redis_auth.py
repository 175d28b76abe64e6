"""The gateway's limiter against a real redis-server that asks for a password (`requirepass`)."""
from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from fixtures.gateway import backend, gateway_config, key_entry, table

pytestmark = pytest.mark.integration

KEY = "sk-test-redis-auth"
HEADERS = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
# Nothing listens on the discard port: a request the limiter admits fails upstream, one it refuses never leaves.
ROUTES = table(tiny={"backends": [backend("b", "http://127.0.0.1:9")]})


@pytest.fixture(scope="module")
def protected_redis():
    """(url, password) of a redis-server started with requirepass."""
    password = secrets.token_urlsafe(24)
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    with tempfile.TemporaryDirectory(prefix="sluice-redis-auth-") as workdir:
        process = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(number), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", workdir, "--requirepass", password],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", number), 0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"-NOAUTH"):
                        break
                assert time.monotonic() < deadline and process.poll() is None, "redis-server did not start"
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{number}/0", password
        finally:
            process.terminate()
            process.wait(timeout=10)


def _config(url: str, tmp_path: Path, password: str | None, tenant: str) -> dict:
    redis = {"url": url, "on_failure": "closed", "timeout_s": 10}
    if password is not None:
        secret = tmp_path / f"{tenant}-password"
        secret.write_text(password + "\n")
        redis["password_file"] = str(secret)
    tenants = [{"name": tenant, "keys": [key_entry(f"{tenant}-key", KEY)], "limits": {"requests_per_minute": 1}}]
    return gateway_config(tenants, redis=redis)


def test_the_limiter_counts_in_a_redis_that_asks_for_a_password(protected_redis, start_gateway, tmp_path):
    url, password = protected_redis
    gateway = start_gateway(_config(url, tmp_path, password, "with-password"), ROUTES)
    first = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=30)
    second = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=30)
    assert first.status_code != 429 and first.json()["error"]["code"] != "limiter_unavailable", first.text
    assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limit_exceeded", second.text
    assert "refused the gateway's credentials" not in gateway.log_text()


def test_a_gateway_whose_redis_refuses_its_password_is_not_ready(protected_redis, start_gateway, tmp_path):
    url, right = protected_redis
    gateway = start_gateway(_config(url, tmp_path, "not-the-password", "not-ready"), ROUTES)
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=30).status_code == 503
    # Load balancers send this replica nothing more: no retry makes the password right.
    ready = httpx.get(f"{gateway.url}/ready", timeout=10)
    assert ready.status_code == 503, ready.text
    error = ready.json()["error"]
    assert error["code"] == "not_ready" and "refused the gateway's credentials" in error["message"], error
    assert right not in ready.text
    assert gateway.metric("sluice_gateway_ready") == 0


@pytest.mark.parametrize("password", [None, "not-the-password"], ids=["none", "wrong"])
def test_without_the_password_requests_are_refused_and_the_log_says_why(protected_redis, start_gateway, tmp_path,
                                                                         password):
    url, right = protected_redis
    gateway = start_gateway(_config(url, tmp_path, password, "no-password"), ROUTES)
    for _ in range(2):
        response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=30)
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "limiter_unavailable" and "refused the gateway's credentials" in error["message"]
        assert right not in response.text
    log = gateway.log_text()
    # Said once, with what to do, not once per request; and never the password itself.
    assert log.count("Redis refused the gateway's credentials") == 1 and "redis.password_file" in log
    assert right not in log


@pytest.mark.parametrize("settings, message", [
    ({"password_file": "/nonexistent/password"}, "No such file"),
    ({"password_file": "/dev/null"}, "is empty"),
    ({"url": "rediss://127.0.0.1:1/0", "tls_ca_file": "/nonexistent/ca.pem"}, "is not a file"),
], ids=["missing-password", "empty-password", "missing-ca"])
def test_an_unreadable_password_or_ca_file_refuses_requests_and_says_why(protected_redis, start_gateway, tmp_path,
                                                                          settings, message):
    url, right = protected_redis
    config = _config(url, tmp_path, None, "files")
    config["redis"].update(settings)
    # Only a restart reads the files again, so the replica is not ready from the start.
    gateway = start_gateway(config, ROUTES, wait_for="/health")
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=HEADERS, timeout=30)
    assert response.status_code == 503 and response.json()["error"]["code"] == "limiter_unavailable", response.text
    assert message in gateway.log_text() and right not in gateway.log_text()
    ready = httpx.get(f"{gateway.url}/ready", timeout=10)
    assert ready.status_code == 503 and message in ready.json()["error"]["message"], ready.text


@pytest.mark.parametrize("redis, message", [
    ({"url": "http://127.0.0.1:6379/0"}, "must start with redis:// or rediss://"),
    ({"url": "redis://127.0.0.1:6379/0", "tls_ca_file": "/etc/hostname"}, "tls_ca_file needs a rediss:// url"),
    ({"url": "redis://127.0.0.1:6379/0", "password_file": None, "username": ""}, "at least 1 character"),
])
def test_bad_redis_settings_are_a_config_error_naming_the_field(tmp_path, redis, message):
    from sluice_gateway.config import ConfigError, load_config

    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(gateway_config([{"name": "t", "keys": [key_entry("k", KEY)]}], redis=redis)))
    with pytest.raises(ConfigError, match=message):
        load_config(path)
