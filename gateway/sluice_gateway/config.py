"""gateway.yaml: listen settings, timeouts, Redis, tenants with hashed keys, allowed models, limits and priority.

In the cluster this file comes from a Secret. API keys are stored only as SHA-256 hex digests
(`printf %s "$KEY" | sha256sum`); each key also has an `id` that logs and metrics use instead of it.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from sluice_contracts import request_priority
from sluice_contracts.runtime_flags import DEFAULT_MAX_NUM_SEQS

from .batch.database import POSTGRES_SCHEMES

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ApiKey(_Strict):
    id: str = Field(min_length=1, description="Safe to log; names the key in access logs and metrics.")
    sha256: str = Field(description="Hex SHA-256 of the key as the client sends it.")

    @field_validator("sha256")
    @classmethod
    def _is_hex_digest(cls, value: str) -> str:
        value = value.strip().lower()
        if not _HEX64.match(value):
            raise ValueError("must be the 64-character hex SHA-256 of the key (printf %s KEY | sha256sum)")
        return value


class Limits(_Strict):
    """Per-tenant limits; None means unlimited. The rule is in gateway/README.md ("Limits")."""

    requests_per_minute: int | None = Field(default=None, gt=0, description="Requests admitted per minute (else 429).")
    tokens_per_minute: int | None = Field(
        default=None, gt=0, description="Prompt and reserved output tokens per minute (else 429)."
    )
    max_concurrent: int | None = Field(default=None, gt=0, description="Requests in flight at once (else 429).")
    over_budget: Literal["refuse", "lower_max_tokens"] = Field(
        default="refuse",
        description="A request whose reservation exceeds the tokens left this minute: refuse it (429), or lower "
                    "its max_tokens to what is left (said in the x-sluice-max-tokens-lowered response header).",
    )
    batch_enqueued_tokens: int | None = Field(
        default=100_000_000, gt=0,
        description="Tokens the tenant's batch lines not yet answered may cost at most, all its batches together; "
                    "a batch that would pass it is refused when it is made (gateway/README.md, \"Batch\").",
    )
    batch_file_bytes: int | None = Field(
        default=1 << 30, gt=0,
        description="Bytes the tenant's files not yet expired may take, uploaded and produced together; an upload "
                    "that would pass it is refused (gateway/README.md, \"Batch\").",
    )


class Tenant(_Strict):
    name: str = Field(min_length=1, description="The tenant's label in metrics and access logs.")
    keys: tuple[ApiKey, ...] = Field(min_length=1, description="The tenant's API keys, at least one.")
    models: tuple[str, ...] = Field(
        default=(), description="Globs of public model names this tenant may use; none when unset (`[\"*\"]`: all).",
    )
    limits: Limits = Limits()
    priority: str | None = Field(default=None, description="A class of priority.classes; default: its default_class.")
    share: float = Field(
        default=request_priority.DEFAULT_SHARE, ge=request_priority.MIN_SHARE, le=request_priority.MAX_SHARE,
        strict=True, description="Weight against the other tenants of its class when a runtime is saturated.",
    )
    prompt_capture_rate: float | None = Field(
        default=None, gt=0, le=1,
        description="Share of this tenant's requests whose prompt and answer go, redacted, to "
                    "audit.prompt_capture.sink, drawn at random for each request; unset: none is captured.",
    )


_CLASS_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
PriorityNumber = Annotated[StrictInt, Field(ge=request_priority.MIN_PRIORITY, le=request_priority.MAX_PRIORITY)]


class Priority(_Strict):
    """Priority classes (name -> number, lower is more urgent: sluice_contracts.request_priority) and the hold that
    requests of classes less urgent than the default one wait in while every replica is saturated."""

    classes: dict[str, PriorityNumber] = Field(
        default_factory=lambda: dict(request_priority.DEFAULT_CLASSES), min_length=1
    )
    default_class: str = Field(default=request_priority.DEFAULT_CLASS, description="The class of a tenant naming none.")
    hold_s: float = Field(
        default=2.0, ge=0, le=60,
        description="Longest wait of a less urgent request for a replica with nothing queued; then 503. 0: no hold.",
    )
    max_held: int = Field(
        default=256, ge=0, le=100_000,
        description="Requests held at once per model, a tenant at most its fair share; more get 503 at once.",
    )

    @field_validator("classes")
    @classmethod
    def _plain_names(cls, classes: dict[str, int]) -> dict[str, int]:
        bad = [name for name in classes if not _CLASS_NAME.match(name)]
        if bad:
            raise ValueError(f"class names are 1-63 lowercase letters, digits, '-' or '_', starting with a letter; "
                             f"got {bad}")
        return classes

    @model_validator(mode="after")
    def _default_is_a_class(self) -> "Priority":
        if self.default_class not in self.classes:
            raise ValueError(f"default_class {self.default_class!r} is not one of the classes {sorted(self.classes)}")
        return self

    def number(self, name: str | None) -> int:
        return self.classes[name or self.default_class]


class Listen(_Strict):
    host: str = Field(default="0.0.0.0", description="Address of the API; `--host` overrides it.")
    port: int = Field(default=8080, ge=0, le=65535, description="Port of the API; `--port` overrides it; 0: a free one.")


class Timeouts(_Strict):
    connect_s: float = Field(default=2.0, gt=0, description="TCP connect to an endpoint.")
    first_byte_s: float = Field(default=120.0, gt=0, description="Until the upstream's response headers.")
    idle_s: float = Field(default=60.0, gt=0, description="Longest silence between two upstream chunks.")
    total_s: float = Field(default=900.0, gt=0, description="Whole request, streaming included.")
    request_read_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="A client's request headers, and then its body, must each arrive within this (else 408).",
    )
    keep_alive_s: float = Field(
        default=5.0, gt=0, le=3600, description="A client connection idle this long (used or not) is closed."
    )
    client_send_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="A client that reads none of its answer for this long is cut off (its request ended, its slot "
                    "and reservation handed back, its connection aborted).",
    )


class Shutdown(_Strict):
    """SIGTERM: /ready fails at once, requests are served `ready_grace_s` more, then in-flight ones drain."""

    ready_grace_s: float = Field(
        default=5.0, ge=0, le=3600, description="Serving on while load balancers take the pod out of rotation."
    )
    drain_s: float | None = Field(
        default=None, gt=0, le=86400,
        description="How long requests in flight may still take after that; default: timeouts.total_s.",
    )


class RedisSettings(_Strict):
    url: str = Field(description="redis://HOST:PORT/DB, or rediss:// for TLS; several gateway replicas share "
                                 "limits through it.")
    on_failure: Literal["open", "closed"] = Field(
        default="open", description="open: admit without limits while Redis is down; closed: answer 503."
    )
    timeout_s: float = Field(default=0.5, gt=0, description="Per Redis call; past it the failure mode applies.")
    username: str | None = Field(default=None, min_length=1, description="Redis ACL user; `default` when unset.")
    password_file: str | None = Field(
        default=None, min_length=1,
        description="File holding the password Redis asks for (`requirepass` or the ACL user's), e.g. a "
                    "mounted Secret; read at start.",
    )
    tls_ca_file: str | None = Field(
        default=None, min_length=1, description="CA bundle that signs the server's certificate (rediss:// only); "
                                                "the system's CAs when unset.",
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://")):
            raise ValueError("must start with redis:// or rediss:// (TLS)")
        return value

    @model_validator(mode="after")
    def _tls_ca_needs_tls(self) -> "RedisSettings":
        if self.tls_ca_file is not None and not self.url.startswith("rediss://"):
            raise ValueError("tls_ca_file needs a rediss:// url")
        return self

    def password(self) -> str | None:
        """The password file's first line; ValueError saying why when it cannot be read. Read when the limiter
        starts, not here: the file is a mounted Secret the config is checked without."""
        if self.password_file is None:
            return None
        try:
            lines = Path(self.password_file).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"redis.password_file {self.password_file}: {exc}") from None
        if not lines or not lines[0]:
            raise ValueError(f"redis.password_file {self.password_file} is empty")
        return lines[0]


class Routing(_Strict):
    session_header: str = Field(default="x-session-id", description="Header naming a session or user.")
    sticky_canary: bool = Field(
        default=True, description="Keep one session on one weighted backend (needs the session header)."
    )
    prefix_chars: int = Field(default=1024, gt=0, description="How much of the prompt prefix affinity hashes.")
    load_bound: float = Field(default=1.25, ge=1.0, description="Bounded-load factor for prefix affinity.")
    max_attempts: int = Field(default=3, ge=1, description="Endpoints tried before the first byte.")
    poll_interval_s: float = Field(default=1.0, gt=0, description="How often each endpoint's /load is polled.")
    poll_timeout_s: float = Field(default=0.5, gt=0, description="A /load poll slower than this counts as slow.")
    unhealthy_after_slow_polls: int = Field(
        default=3, ge=1, strict=True,
        description="Consecutive slow polls that take an endpoint out of rotation (a replica busy with large "
                    "answers can be slow to answer one); a refused connection or an answer that is not a load "
                    "report takes it out at once.")
    eject_after_failures: int = Field(default=3, ge=1, description="Consecutive failures that eject an endpoint.")
    eject_for_s: float = Field(default=10.0, gt=0, description="How long an ejected endpoint is left out.")
    reload_interval_s: float = Field(default=1.0, gt=0, description="How often the routes file is checked.")


class ColdStart(_Strict):
    """A request for a model with no endpoint yet (scaled to zero, or starting) is held until one is ready."""

    max_wait_s: float = Field(
        default=300.0, gt=0, le=3600,
        description="Longest a request is held; past it the client gets 503 with Retry-After.",
    )
    max_held_per_model: int = Field(
        default=100, ge=0, le=100000, strict=True,
        description="Requests held at once per model (per gateway replica), a tenant at most its fair share; one "
                    "more gets 503 with Retry-After. 0: none is held.",
    )
    keepalive_s: float = Field(
        default=5.0, gt=0, le=60,
        description="A held stream gets an SSE comment line this often, so clients and proxies do not time out.",
    )
    retry_after_s: int = Field(default=10, ge=1, le=3600, strict=True, description="Retry-After of the 503 past either bound.")


class Responses(_Strict):
    """Responses stored for `GET /v1/responses/{id}` and `previous_response_id` (`store: true`, the default)."""

    store_ttl_s: int = Field(
        default=30 * 24 * 3600, ge=1, le=366 * 24 * 3600, strict=True,
        description="How long a stored response is kept, in seconds (in Redis when `redis` is set, else in the "
                    "gateway's memory, per replica).",
    )


class Batch(_Strict):
    """OpenAI's Files and Batches API (`/v1/files`, `/v1/batches`); the rules are in gateway/README.md ("Batch")."""

    database: str = Field(
        default="sluice-batch.sqlite3", min_length=1,
        description="Where the files' and batches' metadata and each line's lease live: a SQLite file (relative to "
                    "this file), or a PostgreSQL server as a `postgresql://USER:PASSWORD@HOST:PORT/DB` URL. "
                    "Replicas that share it share the work.",
    )
    database_file: Path | None = Field(
        default=None,
        description="File whose first line is the PostgreSQL URL (with its password), e.g. a mounted Secret, "
                    "in place of `database` (then left unset); relative to this file. Read at each new connection, "
                    "so a rotated Secret is used without a restart.",
    )

    @field_validator("database")
    @classmethod
    def _sqlite_or_postgres(cls, value: str) -> str:
        if "://" in value and not value.startswith(POSTGRES_SCHEMES):
            raise ValueError("must be a SQLite file's path or a postgresql:// URL")
        return value

    @model_validator(mode="after")
    def _one_database(self) -> "Batch":
        if self.database_file is not None and "database" in self.model_fields_set:
            raise ValueError("set database or database_file, not both")
        return self

    files_dir: Path = Field(
        default=Path("sluice-batch-files"), description="Directory holding uploaded and produced files' contents; "
                                                        "relative to this file.",
    )
    max_file_bytes: int = Field(
        default=64 * 1024 * 1024, gt=0, le=1024 * 1024 * 1024, strict=True,
        description="Largest file a tenant may upload (else 413).",
    )
    max_file_lines: int = Field(
        default=50_000, gt=0, le=1_000_000, strict=True, description="Most lines in an uploaded file (else 413).",
    )
    concurrency: int = Field(
        default=DEFAULT_MAX_NUM_SEQS, ge=1, le=1024, strict=True,
        description="Batch lines each gateway replica runs at once; the default fills one runtime's batch "
                    "(its --max-num-seqs default), which an idle replica needs to reach its throughput.",
    )
    lease_s: float = Field(
        default=60.0, ge=1, le=3600,
        description="A line claimed by a replica that stops renewing its lease this long is run by another one.",
    )
    max_attempts: int = Field(
        default=5, ge=1, le=100, strict=True,
        description="Times a line is tried while the runtimes are busy or failing (429, 5xx) before it goes to the "
                    "error file.",
    )
    retry_backoff_s: float = Field(
        default=1.0, ge=0, le=600,
        description="A line whose attempt failed (429, 5xx, an unreachable runtime) is tried again after about "
                    "this long, twice as long after each further failure.",
    )
    priority_class: str | None = Field(
        default=None, description="The class of priority.classes batch lines run at; unset: the least urgent one "
                                  "(the highest value: `batch` among the default classes).",
    )


_Sink = Literal["off", "stdout", "stderr"] | Path


def _sink_value(value: object) -> object:
    return "off" if value is False else value  # YAML reads a bare `off` as false


def _a_file_or_stream(value: str | Path) -> str | Path:
    if isinstance(value, Path) and str(value) in ("", "."):
        raise ValueError("must be off, stdout, stderr or the path of a file")
    return value


class PromptCapture(_Strict):
    """Prompts and answers of the tenants that opt in (`tenants[].prompt_capture_rate`), redacted, on a sink of
    their own; what a record holds and who should read it is in gateway/README.md ("Audit and usage")."""

    sink: _Sink = Field(
        default="off",
        description="Where the captured prompts go: `off`, `stdout` (only with access_log off), `stderr` or a file "
                    "they are appended to (relative to this file); never the audit trail's own sink.",
    )
    redact: tuple[str, ...] = Field(
        default=(),
        description="Regular expressions (Python's `re`) of further text replaced by `[redacted]`, besides the "
                    "built-in ones: e-mail addresses, API keys and bearer tokens, long runs of digits.",
    )
    max_chars: int = Field(
        default=16384, ge=256, le=1 << 20, strict=True,
        description="Characters kept of a request's prompt, and as many of its answer; past them it is cut, and "
                    "the record says so.",
    )

    _unquoted_off = field_validator("sink", mode="before")(_sink_value)
    _names_a_file = field_validator("sink")(_a_file_or_stream)

    @field_validator("redact")
    @classmethod
    def _expressions(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for number, pattern in enumerate(patterns):
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"redact[{number}] {pattern!r} is not a regular expression: {exc}") from None
            if compiled.fullmatch(""):
                raise ValueError(f"redact[{number}] {pattern!r} matches the empty string, so it would redact "
                                 "between every two characters")
        return patterns


class Audit(_Strict):
    """The audit trail: one JSON line per request answered and per admin event, never a prompt, a completion or a
    key; what a record holds is in gateway/README.md ("Audit and usage")."""

    sink: _Sink = Field(
        default="off",
        description="Where the records go: `off`, `stdout`, `stderr` (apart from the access log, which is on "
                    "stdout), or a file they are appended to (relative to this file); a file that cannot be "
                    "opened leaves the gateway not ready.",
    )
    prompt_capture: PromptCapture = PromptCapture()

    _unquoted_off = field_validator("sink", mode="before")(_sink_value)
    _names_a_file = field_validator("sink")(_a_file_or_stream)

    @model_validator(mode="after")
    def _capture_apart(self) -> "Audit":
        capture = self.prompt_capture.sink
        if capture != "off" and capture == self.sink:
            raise ValueError(f"prompt_capture.sink {str(capture)!r} is the audit trail's own sink: captured prompts "
                             "need one of their own")
        return self


class GatewayConfig(_Strict):
    listen: Listen = Listen()
    metrics_port: int = Field(
        default=9090, ge=0, le=65535, description="/metrics is served here (same host as the API); 0: off."
    )
    timeouts: Timeouts = Timeouts()
    shutdown: Shutdown = Shutdown()
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0, description="Largest request body (else 413).")
    max_response_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="Largest non-streaming upstream response passed on (else 502)."
    )
    max_held_response_bytes: int = Field(
        default=64 * 1024 * 1024, gt=0,
        description="Bytes of non-streaming answers held at once, all requests together; an answer that would "
                    "pass it is passed through as it arrives instead of held whole.",
    )
    upstream_credential_file: Path | None = Field(
        default=None, description="Runtime credential sent upstream as a Bearer token; relative to this file."
    )
    default_max_tokens: int = Field(
        default=512, gt=0,
        description="Output tokens reserved for a request without max_tokens whose backend has no maxModelLen.",
    )
    routes_file: Path | None = Field(
        default=None, description="Routing table used when --routes is not given; relative to this file."
    )
    redis: RedisSettings | None = None
    routing: Routing = Routing()
    cold_start: ColdStart = ColdStart()
    responses: Responses = Responses()
    batch: Batch = Batch()
    admin_keys: tuple[ApiKey, ...] = Field(default=(), description="Keys that open `/admin/*`, and nothing else.")
    priority: Priority = Priority()
    tenants: tuple[Tenant, ...] = Field(default=(), description="Who may call the API, with which keys and limits.")
    access_log: bool = Field(default=True, description="One JSON line per request on stdout.")
    audit: Audit = Audit()

    @property
    def drain_s(self) -> float:
        return self.shutdown.drain_s if self.shutdown.drain_s is not None else self.timeouts.total_s

    @model_validator(mode="after")
    def _ports_differ(self) -> "GatewayConfig":
        if self.metrics_port and self.metrics_port == self.listen.port:
            raise ValueError(f"metrics_port {self.metrics_port} must differ from listen.port (or be 0: off)")
        return self

    @model_validator(mode="after")
    def _unique_names_and_keys(self) -> "GatewayConfig":
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"tenant names must be unique, got {names}")
        digests = [k.sha256 for t in self.tenants for k in t.keys] + [k.sha256 for k in self.admin_keys]
        if len(set(digests)) != len(digests):
            raise ValueError("the same API key is listed twice")
        return self

    @model_validator(mode="after")
    def _batch_class_exists(self) -> "GatewayConfig":
        chosen = self.batch.priority_class
        if chosen is not None and chosen not in self.priority.classes:
            raise ValueError(f"batch.priority_class {chosen!r} is not one of the classes "
                             f"{sorted(self.priority.classes)} (priority.classes)")
        return self

    @property
    def batch_priority_class(self) -> str:
        """The class batch lines run at."""
        classes = self.priority.classes
        return self.batch.priority_class or max(classes, key=lambda name: (classes[name], name))

    @model_validator(mode="after")
    def _capture_has_a_sink_of_its_own(self) -> "GatewayConfig":
        capture = self.audit.prompt_capture.sink
        if capture == "stdout" and self.access_log:
            raise ValueError("audit.prompt_capture.sink stdout would mix captured prompts into the access log: "
                             "set access_log false, or give the capture a file")
        if capture == "off" and (opted := [t.name for t in self.tenants if t.prompt_capture_rate is not None]):
            raise ValueError(f"tenants {opted} set prompt_capture_rate, but audit.prompt_capture.sink is off")
        return self

    @model_validator(mode="after")
    def _tenant_classes_exist(self) -> "GatewayConfig":
        for tenant in self.tenants:
            if tenant.priority is not None and tenant.priority not in self.priority.classes:
                raise ValueError(f"tenant {tenant.name!r}: priority {tenant.priority!r} is not one of the classes "
                                 f"{sorted(self.priority.classes)} (priority.classes)")
        return self


# What a running gateway applies when gateway.yaml changes (read per use); every other field is bound at start, and a
# change to it is logged and waits for a restart. The chart restarts the pods on a change to those only: its copy of
# this list (charts/sluice/files/gateway-reloadable-fields.yaml) is checked against this one by tests/chart.
RELOADABLE_FIELDS = frozenset({"tenants", "admin_keys", "access_log", "max_body_bytes", "default_max_tokens", "shutdown",
                               "priority"})
START_ONLY_FIELDS = tuple(name for name in GatewayConfig.model_fields if name not in RELOADABLE_FIELDS)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; in this file the first could be the one meant (a
    second `tenants:` would hide every key of the first), so it is an error."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class ConfigError(ValueError):
    """gateway.yaml is missing or invalid; the message says where and why."""


def load_config(path: str | Path) -> GatewayConfig:
    try:
        data = yaml.load(Path(path).read_text(), Loader=_UniqueKeyLoader)
    except OSError as exc:
        raise ConfigError(f"cannot read gateway config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"gateway config {path} is not valid YAML: {exc}") from None
    try:
        config = GatewayConfig.model_validate({} if data is None else data)  # None: an empty file
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid gateway config {path}: {problems}") from None
    relative = {
        name: Path(path).parent / value
        for name in ("routes_file", "upstream_credential_file")
        if (value := getattr(config, name)) is not None and not value.is_absolute()
    }
    batch: dict[str, object] = {}
    if not config.batch.files_dir.is_absolute():
        batch["files_dir"] = Path(path).parent / config.batch.files_dir
    if config.batch.database_file is not None:
        if not config.batch.database_file.is_absolute():
            batch["database_file"] = Path(path).parent / config.batch.database_file
    elif not config.batch.database.startswith(POSTGRES_SCHEMES) and not Path(config.batch.database).is_absolute():
        batch["database"] = str(Path(path).parent / config.batch.database)
    if batch:
        relative["batch"] = config.batch.model_copy(update=batch)
    audit = config.audit
    sink, capture = (Path(path).parent / value if isinstance(value, Path) and not value.is_absolute() else value
                     for value in (audit.sink, audit.prompt_capture.sink))
    if (sink, capture) != (audit.sink, audit.prompt_capture.sink):
        relative["audit"] = audit.model_copy(update={
            "sink": sink, "prompt_capture": audit.prompt_capture.model_copy(update={"sink": capture})})
    if isinstance(sink, Path) and isinstance(capture, Path) and sink.resolve() == capture.resolve():
        raise ConfigError(f"invalid gateway config {path}: audit.prompt_capture.sink {capture} is the audit "
                          "trail's own file: captured prompts need one of their own")
    return config.model_copy(update=relative) if relative else config

