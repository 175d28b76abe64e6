"""The FastAPI application: routes wired to the normalizer, the generation runner and the engine."""
from __future__ import annotations

import logging
import re
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from sluice_contracts import prompt_reservation
from sluice_contracts.load_report import LoadReport, PrefixCacheStats
from sluice_contracts.runtime_flags import LORA_NAME_PATTERN, lora_name_message
from sluice_runtime.engine.errors import EngineDead, EngineError
from sluice_runtime.engine.lora_registry import LoraNotFound
from sluice_runtime.models.lora_adapter import AdapterError
from sluice_runtime.sampling_params import SamplingParams

from .capabilities import ModelCapabilities
from .chat_format import ChatFormat
from .chat_template import ChatTemplate
from .completion_format import CompletionFormat
from .disconnect import until_disconnected
from .errors import APIError, install_error_handlers, invalid_request
from .generation import GenerationRunner, engine_error
from .lifecycle import Lifecycle
from .logprobs import LogprobFormatter
from .metrics import RuntimeMetrics
from .middleware import RequestContextMiddleware
from .normalize import RequestNormalizer
from .pooling import PoolingServing
from .priority_headers import apply_priority_headers
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    LoadLoraAdapterRequest,
    ModelCard,
    ModelList,
    RerankRequest,
    RerankResponse,
    TokenizeRequest,
    TokenizeResponse,
    UnloadLoraAdapterRequest,
)
from .request_body import off_loop_if_large, read_json, request_cost, validated
from .reservation import check_reservation, reserved_prompt_tokens
from .served_version import ServedVersion
from .serving import GenerationServing
from .settings import ServerSettings
from .structured_output import GrammarCompiler
from .tracing_setup import tracing_from_environment

log = logging.getLogger("sluice.server")


class Runtime:
    """Everything the routes share, built once from the engine and the settings."""

    def __init__(self, engine, settings: ServerSettings):
        info = engine.model_info
        self.engine = engine
        self.settings = settings
        self.tokenizer = engine.tokenizer
        self.served_names = settings.served_model_names or [info.name]
        self.template = ChatTemplate.load(self.tokenizer, settings.chat_template)
        self.version = ServedVersion.of(settings.model_version, engine.config.model, info.path, self.template.version)
        self.capabilities = ModelCapabilities.for_text_model(info.max_model_len, self.template.source is not None,
                                                             engine.config.pooling, info.hidden_size)
        self.lifecycle = Lifecycle()
        self.metrics = RuntimeMetrics(self.served_names[0], engine.stats, self.template.version,
                                      engine.config.max_loras if engine.config.enable_lora else None)
        grammars = GrammarCompiler(self.tokenizer, info.vocab_size, list(info.eos_token_ids))
        self.normalizer = RequestNormalizer(self.tokenizer, self.template, self.capabilities, grammars,
                                            self.served_names, info.vocab_size, engine.lora_names)
        runner = GenerationRunner(engine, self.lifecycle, self.metrics, settings)
        formatter = LogprobFormatter(self.tokenizer)
        self.chat = GenerationServing(runner, ChatFormat(formatter), self.version.fingerprint)
        self.completions = GenerationServing(runner, CompletionFormat(formatter, self.tokenizer),
                                             self.version.fingerprint)
        self.pooling = PoolingServing(engine, self.lifecycle, self.metrics)
        self.created = int(time.time())

    async def warm_up(self) -> None:
        """One tiny generation, so the first real request does not pay for lazy initialization."""
        prompt = self.tokenizer.encode("Hello", add_special_tokens=True)
        async for _ in self.engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0.0), "warmup"):
            pass
        self.lifecycle.warmed_up = True
        log.info("warm-up done; %s", self.version.describe())

    async def generate(self, request: Request, endpoint: str) -> Response:
        """A /v1/chat/completions or /v1/completions request, from its body to its response or stream."""
        schema, normalize, serving = ((ChatCompletionRequest, self.normalizer.chat, self.chat) if endpoint == "chat"
                                      else (CompletionRequest, self.normalizer.completion, self.completions))
        reserved = reserved_prompt_tokens(request.headers)
        payload = await read_json(request)
        body = validated(schema, payload)
        record = self.record(request, body.model, body.stream)
        cost = request_cost(payload, endpoint)
        greq = await off_loop_if_large(request, normalize, body, cost, request.state.request_id)
        check_reservation(reserved, greq.prompts, prompt_reservation.PARAM if endpoint == "chat" else "prompt")
        apply_priority_headers(greq, request.headers)
        self._describe(record, greq)
        self.metrics.in_flight.inc()
        try:
            return await serving.respond(greq, request.receive, record)
        finally:
            self.metrics.in_flight.dec()

    async def embed(self, request: Request) -> EmbeddingResponse:
        reserved = reserved_prompt_tokens(request.headers)
        body = validated(EmbeddingRequest, await read_json(request))
        record = self.record(request, body.model)
        prompts = await off_loop_if_large(request, self.normalizer.embedding_inputs, body)
        check_reservation(reserved, prompts, "input")
        return await self.pooling.embeddings(body, prompts, request.state.request_id, request.receive, record)

    async def rerank(self, request: Request) -> RerankResponse:
        reserved = reserved_prompt_tokens(request.headers)
        body = validated(RerankRequest, await read_json(request))
        record = self.record(request, body.model)
        prompts = await off_loop_if_large(request, self.normalizer.rerank_inputs, body)
        # The query is pooled like each document, so it is prompt too.
        check_reservation(reserved, prompts, "documents")
        return await self.pooling.rerank(body, prompts, request.state.request_id, request.receive, record)

    def _describe(self, record, greq) -> None:
        record.sampling = {k: v for k, v in vars(greq.params).items() if k != "constraint"}
        record.sampling["response_format"] = greq.response_format
        record.priority, record.tenant = greq.priority, greq.tenant or None
        if self.settings.log_prompts:
            record.prompt = "\n".join(t for t in greq.prompt_texts if t is not None)

    def record(self, request: Request, model: str | None, stream: bool | None = None):
        record = request.state.record
        record.model = model
        record.template_version = self.template.version
        record.stream = stream
        return record


def build_app(engine, settings: ServerSettings) -> FastAPI:
    rt = Runtime(engine, settings)
    tracing = tracing_from_environment()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await rt.warm_up()
        yield
        engine.shutdown()
        if tracing is not None:
            tracing.shutdown()

    app = FastAPI(title="Sluice runtime", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible inference server for one model replica.")
    app.state.runtime = rt
    install_error_handlers(app)
    app.add_middleware(RequestContextMiddleware, max_body_bytes=settings.max_body_bytes,
                       lifecycle=rt.lifecycle, metrics=rt.metrics, credential=settings.credential,
                       model_version=rt.version.version, tracing=tracing)
    for route in _generation_routes(rt) + _model_routes(rt) + _lora_routes(rt) + _operational_routes(rt):
        _register(app, route)
    return app


@dataclass(frozen=True)
class _Route:
    method: str
    path: str
    handler: Callable
    response_model: type | None = None  # None: the handler returns its Response itself


def _register(app: FastAPI, route: _Route) -> None:
    app.add_api_route(route.path, route.handler, methods=[route.method], response_model=route.response_model)


def _generation_routes(rt: Runtime) -> list[_Route]:
    """The model at work. Bodies are read by request_body rather than by FastAPI: cost fields come from the raw JSON."""
    async def chat_completions(request: Request) -> Response:
        return await rt.generate(request, "chat")

    async def completions(request: Request) -> Response:
        return await rt.generate(request, "completion")

    async def embeddings(request: Request) -> EmbeddingResponse:
        return await rt.embed(request)

    async def rerank(request: Request) -> RerankResponse:
        return await rt.rerank(request)

    return [_Route("POST", "/v1/chat/completions", chat_completions),
            _Route("POST", "/v1/completions", completions),
            _Route("POST", "/v1/embeddings", embeddings, EmbeddingResponse),
            _Route("POST", "/v1/rerank", rerank, RerankResponse)]


def _model_routes(rt: Runtime) -> list[_Route]:
    """What the model is and how it reads text: its cards, and its tokenizer both ways."""
    async def models():
        loras = rt.engine.lora_names()
        return ModelList(data=[_card(rt, name) for name in rt.served_names]
                         + [_lora_card(rt, name, path) for name, path in loras.items()])

    async def model(model: str):
        rt.normalizer.check_model(model)
        path = rt.engine.lora_names().get(model)
        return _card(rt, model) if model in rt.served_names or path is None else _lora_card(rt, model, path)

    async def tokenize(request: Request):
        body = validated(TokenizeRequest, await read_json(request))
        rt.record(request, body.model)
        tokens = await off_loop_if_large(request, rt.normalizer.tokenize, body)
        return TokenizeResponse(tokens=tokens, count=len(tokens), max_model_len=rt.capabilities.max_model_len)

    async def detokenize(request: Request):
        body = validated(DetokenizeRequest, await read_json(request))
        rt.record(request, body.model)
        rt.normalizer.check_model(body.model)
        rt.normalizer.check_token_ids(body.tokens, "tokens")
        return DetokenizeResponse(prompt=rt.tokenizer.decode(body.tokens))

    return [_Route("GET", "/v1/models", models, ModelList),
            _Route("GET", "/v1/models/{model:path}", model, ModelCard),
            _Route("POST", "/tokenize", tokenize, TokenizeResponse),
            _Route("POST", "/detokenize", detokenize, DetokenizeResponse)]


def _lora_routes(rt: Runtime) -> list[_Route]:
    """vLLM's adapter loading API: the operator loads and unloads adapters on running replicas."""
    def check_enabled() -> None:
        if not rt.engine.config.enable_lora:
            raise invalid_request("LoRA adapters are not enabled on this server; start it with --enable-lora.",
                                  code="lora_not_enabled")

    async def load(request: Request):
        body = validated(LoadLoraAdapterRequest, await read_json(request))
        rt.record(request, body.lora_name)
        check_enabled()
        name = body.lora_name
        if not re.fullmatch(LORA_NAME_PATTERN, name):
            raise invalid_request(lora_name_message(name), param="lora_name")
        if name in rt.served_names:
            raise invalid_request(f"'{name}' is the base model's name; give the adapter another.", param="lora_name")
        if name in rt.engine.lora_names():
            raise invalid_request(f"The lora adapter '{name}' has already been loaded.", param="lora_name",
                                  code="lora_already_loaded")
        try:
            await until_disconnected(request.receive, rt.engine.load_lora(name, body.lora_path))
        except AdapterError as exc:
            raise invalid_request(str(exc), param="lora_path", code="invalid_lora_adapter") from None
        except EngineError as exc:
            raise engine_error(exc) from None
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(request: Request):
        body = validated(UnloadLoraAdapterRequest, await read_json(request))
        rt.record(request, body.lora_name)
        check_enabled()
        try:
            await until_disconnected(request.receive, rt.engine.unload_lora(body.lora_name))
        except LoraNotFound as exc:
            raise APIError(404, str(exc), param="lora_name", code="model_not_found") from None
        except EngineError as exc:
            raise engine_error(exc) from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    return [_Route("POST", "/v1/load_lora_adapter", load), _Route("POST", "/v1/unload_lora_adapter", unload)]


def _operational_routes(rt: Runtime) -> list[_Route]:
    """Probes, the scraper's /metrics and the gateway's /load: open without the credential, kept while draining."""
    async def health():
        # The liveness probe: a replica whose engine loop ended serves nothing again until it restarts.
        if not rt.engine.is_running:
            raise APIError(503, "The engine loop is not running; this replica must be restarted.",
                           type="server_error", code=EngineDead.code)
        return {"status": "ok"}

    async def ready():
        reason = None
        if not rt.lifecycle.warmed_up:
            reason = "warming up"
        elif rt.lifecycle.draining:
            reason = "draining"
        elif not rt.engine.is_running:
            reason = "engine stopped"
        if reason:
            return JSONResponse({"ready": False, "reason": reason}, status_code=503)
        return {"ready": True}

    async def load():
        s = rt.engine.stats()
        return LoadReport(model=rt.served_names[0], waiting=s.num_waiting, running=s.num_running,
                          kv_cache_usage=s.kv_cache_usage, block_size=s.block_size, num_kv_blocks=s.num_kv_blocks,
                          prefix_cache=PrefixCacheStats.of(s.prefix_cache_queries, s.prefix_cache_hits),
                          in_flight=rt.lifecycle.running, draining=rt.lifecycle.draining,
                          estimated_queue_s=s.estimated_queue_s,
                          loaded_adapters=tuple(s.resident_loras) if rt.engine.config.enable_lora else None)

    async def metrics():
        return Response(rt.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    routes = [_Route("GET", "/health", health), _Route("GET", "/ready", ready), _Route("GET", "/metrics", metrics)]
    if rt.settings.load_endpoint:
        routes.append(_Route("GET", "/load", load, LoadReport))
    return routes


def _card(rt: Runtime, name: str) -> ModelCard:
    return ModelCard(id=name, created=rt.created, root=str(rt.engine.model_info.path),
                     max_model_len=rt.capabilities.max_model_len, capabilities=rt.capabilities.as_dict(),
                     chat_template_version=rt.template.version)



def _lora_card(rt: Runtime, name: str, path: str) -> ModelCard:
    return ModelCard(id=name, created=rt.created, root=path, parent=rt.served_names[0],
                     max_model_len=rt.capabilities.max_model_len, capabilities=rt.capabilities.as_dict(),
                     chat_template_version=rt.template.version)
