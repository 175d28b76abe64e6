"""Server-side settings (the engine has its own EngineConfig); each field is also its CLI flag, with a working default."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from sluice_contracts import model_version
from sluice_contracts.runtime_credential import ROTATION_GRACE_S
from sluice_runtime.engine_config import parse_memory
from sluice_runtime.flags import add_flags, flag, from_flags

from .credential import RuntimeCredential


@dataclass
class ServerSettings:
    host: str = flag("0.0.0.0", "address to listen on")
    port: int = flag(8000, "port to listen on; 0 picks a free one")
    # The first name is the one reported.
    served_model_names: list[str] = flag(default_factory=list, help="model names clients may use (default: the "
                                         "model's name)", option="--served-model-name", nargs="+", metavar="NAME")
    chat_template: str | None = flag(None, "Jinja chat template replacing the model's own", metavar="FILE")
    model_version: str | None = flag(None, "the version every answer names (x-sluice-model-version, and as "
                                           "system_fingerprint its digest); the operator passes the InferenceModel's "
                                           "weights: source@revision (default: the --model argument)",
                                     metavar="VERSION")
    log_prompts: bool = flag(False, "include prompt text in request logs")
    max_body_bytes: int | str = flag(8 << 20, "largest accepted request body, e.g. 8MiB", parse=str)
    shutdown_timeout: float = flag(30.0, "seconds running requests may take to finish after SIGTERM")
    request_timeout: float | None = flag(600.0, "seconds a generation request may run before it is stopped")
    stream_idle_timeout: float = flag(60.0, "seconds a streaming client may read nothing before its request is "
                                            "aborted and its KV blocks freed")
    stream_heartbeat_s: float = flag(15.0, "seconds a stream may send nothing while its generated text is held back "
                                           "(a tool call read whole, what may begin a stop sequence); a comment line "
                                           "goes out then, so that idle timeouts of proxies and the gateway do not "
                                           "cut it")
    print_examples: bool = flag(False, "print ready-to-paste curl and Python examples once serving")
    load_endpoint: bool = flag(True, "serve no GET /load, as vLLM and SGLang do (the gateway then reads /metrics)",
                               option="--no-load-endpoint")
    # None: every caller is served (the local `make run` case).
    api_key_file: str | None = flag(None, "file holding the runtime credential; when given, every path but "
                                          "/health, /ready, /metrics and /load needs 'Authorization: Bearer "
                                          "<credential>'", metavar="PATH")
    api_key_grace_s: float = flag(ROTATION_GRACE_S, "seconds the credential a rotation replaced is still accepted "
                                                    "(the gateway may read the rotated Secret later)")
    credential: RuntimeCredential | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.max_body_bytes = parse_memory(self.max_body_bytes)
        checks = [
            (0 <= self.port <= 65535, f"port must be in [0, 65535], got {self.port}"),
            (self.max_body_bytes >= 1024, f"max body bytes must be at least 1024, got {self.max_body_bytes}"),
            (self.shutdown_timeout >= 0, f"shutdown timeout must be non-negative, got {self.shutdown_timeout}"),
            (self.request_timeout is None or self.request_timeout > 0,
             f"request timeout must be positive, got {self.request_timeout}"),
            (self.stream_idle_timeout > 0, f"stream idle timeout must be positive, got {self.stream_idle_timeout}"),
            (self.stream_heartbeat_s > 0, f"stream heartbeat must be positive, got {self.stream_heartbeat_s}"),
            (all(n.strip() for n in self.served_model_names), "served model names must be non-empty"),
            (0 <= self.api_key_grace_s <= 86400, f"api key grace must be in [0, 86400] s, got {self.api_key_grace_s}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.model_version is not None:
            model_version.check(self.model_version)
        if self.api_key_file is not None:
            self.credential = RuntimeCredential(self.api_key_file, self.api_key_grace_s)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add_flags(parser, "server", ServerSettings)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerSettings":
        return from_flags(cls, args)
