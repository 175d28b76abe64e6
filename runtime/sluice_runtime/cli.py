"""`sluice-runtime serve`: load the model, warm up, serve the OpenAI API, drain on SIGTERM."""
from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys

from sluice_runtime import writable_dirs
from sluice_runtime.engine_config import EngineConfig
from sluice_runtime.server.settings import ServerSettings


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(prog="sluice-runtime", description="Sluice model runtime")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve one model over the OpenAI-compatible HTTP API")
    EngineConfig.add_cli_args(serve)
    ServerSettings.add_cli_args(serve)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser, serve


# Each connection's kernel send buffer (accepted sockets inherit it from the listening one). Left alone, Linux
# grows it up to tcp_wmem's maximum (4 MiB) for a client that does not read: memory the pod is charged for, and
# a stream whose client stopped reading would keep "sending" for megabytes before its idle timeout could start.
# Ample for any link inside a cluster.
_SEND_BUFFER_BYTES = 64 << 10


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Request lines are JSON documents of their own, one per line on stdout, for log collectors.
    requests = logging.getLogger("sluice.requests")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    requests.addHandler(handler)
    requests.propagate = False
    requests.setLevel(logging.INFO)


def _examples(url: str, model: str) -> str:
    return f"""
Try it:
  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Say hello"}}], "max_tokens": 32}}'

  python -c 'from openai import OpenAI
c = OpenAI(base_url="{url}/v1", api_key="unused")
r = c.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Say hello"}}], max_tokens=32)
print(r.choices[0].message.content)'
"""


def _server_class():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn that, on the first SIGTERM/SIGINT, drains before it stops listening; a second one forces."""

        def __init__(self, config, runtime, settings: ServerSettings):
            super().__init__(config)
            self._runtime = runtime
            self._settings = settings
            self._draining = False

        def handle_exit(self, sig, frame) -> None:
            if self._draining or not self.started:
                self.should_exit = True
                self.force_exit = self._draining
                return
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())

        async def _drain(self) -> None:
            await self._runtime.lifecycle.drain(self._runtime.engine.abort, self._settings.shutdown_timeout)
            self.should_exit = True

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if not self.started:
                return
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            url = f"http://{shown}:{port}"
            print(f"sluice-runtime: serving {self._runtime.served_names[0]} at {url}", flush=True)
            if self._settings.print_examples:
                print(_examples(url, self._runtime.served_names[0]), flush=True)

    return DrainingServer


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        engine_config = EngineConfig.from_cli_args(args)
        settings = ServerSettings.from_cli_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        writable_dirs.prepare()
    except writable_dirs.UnwritableDir as exc:
        print(f"sluice-runtime: error: {exc}", file=sys.stderr)
        return 1
    # Heavy imports only once the arguments and directories are known to be good, so mistakes answer fast.
    import uvicorn

    from sluice_runtime.engine.async_engine import AsyncEngine
    from sluice_runtime.model_load_error import ModelLoadError
    from sluice_runtime.server.app import build_app
    from sluice_runtime.server.http_head import BoundedHeadProtocol

    try:
        engine = AsyncEngine.from_config(engine_config)
    except ModelLoadError as exc:
        print(f"sluice-runtime: error: {exc}", file=sys.stderr)
        return 1
    try:
        app = build_app(engine, settings)
    except ValueError as exc:
        engine.shutdown()
        print(f"sluice-runtime: error: {exc}", file=sys.stderr)
        return 1
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=False,
                            timeout_graceful_shutdown=5, timeout_keep_alive=30, http=BoundedHeadProtocol)
    server = _server_class()(config, app.state.runtime, settings)
    listener = config.bind_socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER_BYTES)
    server.run(sockets=[listener])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser, serve_parser = _parser()
    args = parser.parse_args(argv)
    _configure_logging(args.log_level)
    return serve(args, serve_parser)


if __name__ == "__main__":
    sys.exit(main())
