"""Server-side settings (the engine has its own EngineConfig); every knob has a working default."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from sluice_runtime.engine.config import parse_memory

from .credential import RuntimeCredential


@dataclass
class ServerSettings:
    host: str = "0.0.0.0"
    port: int = 8000
    # Names clients may send as `model`; the first is reported. Empty: the model's own name.
    served_model_names: list[str] = field(default_factory=list)
    chat_template: str | None = None
    log_prompts: bool = False
    max_body_bytes: int = 8 << 20
    # SIGTERM: stop taking requests, let running ones finish for this long, then abort them.
    shutdown_timeout: float = 30.0
    # Generation requests still running after this many seconds end with a timeout error.
    request_timeout: float | None = 600.0
    # A stream whose client has read nothing for this many seconds is aborted and its KV blocks freed.
    stream_idle_timeout: float = 60.0
    print_examples: bool = False
    # The mounted runtime credential; None: every caller is served (the local `make run` case).
    api_key_file: str | None = None
    credential: RuntimeCredential | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        checks = [
            (0 <= self.port <= 65535, f"port must be in [0, 65535], got {self.port}"),
            (self.max_body_bytes >= 1024, f"max body bytes must be at least 1024, got {self.max_body_bytes}"),
            (self.shutdown_timeout >= 0, f"shutdown timeout must be non-negative, got {self.shutdown_timeout}"),
            (self.request_timeout is None or self.request_timeout > 0,
             f"request timeout must be positive, got {self.request_timeout}"),
            (self.stream_idle_timeout > 0, f"stream idle timeout must be positive, got {self.stream_idle_timeout}"),
            (all(n.strip() for n in self.served_model_names), "served model names must be non-empty"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.api_key_file is not None:
            self.credential = RuntimeCredential(self.api_key_file)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("server")
        group.add_argument("--host", default="0.0.0.0", help="address to listen on")
        group.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one")
        group.add_argument("--served-model-name", dest="served_model_names", nargs="+", default=[],
                           metavar="NAME", help="model names clients may use (default: the model's name)")
        group.add_argument("--chat-template", default=None, metavar="FILE",
                           help="Jinja chat template replacing the model's own")
        group.add_argument("--log-prompts", action="store_true", help="include prompt text in request logs")
        group.add_argument("--max-body-bytes", default="8MiB", help="largest accepted request body, e.g. 8MiB")
        group.add_argument("--shutdown-timeout", type=float, default=30.0,
                           help="seconds running requests may take to finish after SIGTERM")
        group.add_argument("--request-timeout", type=float, default=600.0,
                           help="seconds a generation request may run before it is stopped")
        group.add_argument("--stream-idle-timeout", type=float, default=60.0,
                           help="seconds a streaming client may read nothing before its request is aborted")
        group.add_argument("--print-examples", action="store_true",
                           help="print ready-to-paste curl and Python examples once serving")
        group.add_argument("--api-key-file", default=None, metavar="PATH",
                           help="file holding the runtime credential; when given, every path but /health, /ready, "
                                "/metrics and /load needs 'Authorization: Bearer <credential>'")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerSettings":
        return cls(host=args.host, port=args.port, served_model_names=list(args.served_model_names),
                   chat_template=args.chat_template, log_prompts=args.log_prompts,
                   max_body_bytes=parse_memory(args.max_body_bytes), shutdown_timeout=args.shutdown_timeout,
                   request_timeout=args.request_timeout, stream_idle_timeout=args.stream_idle_timeout,
                   print_examples=args.print_examples,
                   api_key_file=args.api_key_file)
