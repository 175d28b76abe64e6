"""The engine loop on its own thread, with an asyncio API for the server."""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import Future

from ..engine_config import EngineConfig
from ..sampling_params import SamplingParams
from .errors import EngineDead, EngineError, EngineOverloaded
from .llm_engine import EngineStats, LLMEngine
from .output_mailbox import OutputMailbox
from .outputs import SHED, RequestOutput

log = logging.getLogger(__name__)


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_info = engine.model_info
        self.config = engine.config
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, OutputMailbox]] = {}
        self._calls: deque[tuple[callable, Future]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="sluice-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> "AsyncEngine":
        return cls(LLMEngine(config))

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self.error is None and not self._stop

    def _dead(self) -> EngineDead:
        if self.error is not None:
            return EngineDead(f"the engine loop crashed: {self.error!r}")
        return EngineDead("the engine loop is not running" + (": it was shut down" if self._stop else ""))

    # -- requests -------------------------------------------------------------------------------

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str, *,
                       priority: int = 0, deadline: float | None = None, tenant: str = "",
                       share: float = 1.0, lora: str | None = None,
                       streamed: bool = True) -> AsyncIterator[RequestOutput]:
        if not self.is_running:
            raise self._dead()
        if request_id in self._streams:
            # Checked before registering: the cleanup of a refused duplicate must not drop the first one's stream.
            raise ValueError(f"request id {request_id!r} is already in use")
        mailbox = OutputMailbox()
        self._streams[request_id] = (asyncio.get_running_loop(), mailbox)
        try:
            self.engine.add_request(request_id, prompt_token_ids, params, priority, deadline, tenant, share, lora,
                                    streamed)
        except BaseException:
            self._streams.pop(request_id, None)
            raise
        self._wake.set()
        finished = False
        try:
            if not self.is_running:
                # The loop ended between the check above and the registration: its last delivery may have missed
                # this stream, and nothing would ever fill the mailbox.
                raise self._dead()
            while True:
                item = await mailbox.get()
                if item.finished and item.outputs[0].finish_reason == SHED:
                    finished = True
                    raise EngineOverloaded("the engine's queue is full and a more urgent request took this one's "
                                           "place before it started; retry shortly", retry_after_s=1.0)
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    async def embed(self, prompts: list[list[int]], dimensions: int | None = None) -> list[list[float]]:
        """Pooled, normalized vectors of `prompts`, in order; each packed forward (LLMEngine.embedding_batches)
        runs on the engine thread between two steps, so streams keep going while a large request is embedded."""
        if not self.is_running:
            raise self._dead()
        vectors: list[list[float]] = []
        for batch in self.engine.embedding_batches(prompts):
            vectors += await asyncio.wrap_future(self._call(lambda b=batch: self.engine.embed(b, dimensions)))
        return vectors

    async def load_lora(self, name: str, path: str) -> None:
        """Read and check the adapter off the engine thread, then serve it from the next step."""
        adapter = await asyncio.to_thread(self.engine.read_lora, path)
        await asyncio.wrap_future(self._call(lambda: self.engine.add_lora(name, path, adapter)))

    async def unload_lora(self, name: str) -> None:
        await asyncio.wrap_future(self._call(lambda: self.engine.remove_lora(name)))

    def lora_names(self) -> dict[str, str]:
        """Adapters served now, name -> path."""
        return {name: ref.path for name, ref in list(self.engine.loras.by_name.items())}

    def _call(self, fn) -> Future:
        """Run fn on the engine thread between steps, so torch is never used from two threads."""
        future: Future = Future()
        self._calls.append((fn, future))
        self._wake.set()
        if not self.is_running:
            # Nobody will run it; the loop may have drained the queue before this call joined it.
            self._fail_calls()
        return future

    def _fail_calls(self) -> None:
        while True:
            try:
                _, future = self._calls.popleft()
            except IndexError:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(self._dead())

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        import torch

        with torch.inference_mode():
            try:
                while not self._stop:
                    while self._calls:
                        _run_call(*self._calls.popleft())
                    if not self.engine.has_unfinished_requests():
                        self._wake.wait(timeout=0.5)
                        self._wake.clear()
                        continue
                    self._deliver([(output.request_id, output) for output in self.engine.step()])
            except BaseException as exc:
                log.exception("engine loop crashed")
                self.error = exc
            finally:
                # Whoever still waits learns the engine is gone instead of waiting forever.
                self._deliver([(request_id, self._dead()) for request_id in list(self._streams)])
                self._fail_calls()

    def _deliver(self, items: list[tuple[str, object]]) -> None:
        """Hands a step's outputs to their streams with one wake-up per event loop, not one per
        request: each wake-up is a system call and a turn of the loop, taken from the CPU the
        engine is computing on."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[str, OutputMailbox, object]]] = {}
        for request_id, item in items:
            target = self._streams.get(request_id)
            if target is not None:
                by_loop.setdefault(target[0], []).append((request_id, target[1], item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:
                # The callers' event loop is closed; nobody is listening any more.
                for request_id, _, _ in batch:
                    self.engine.abort(request_id)


def _run_call(fn, future: Future) -> None:
    """Runs a queued call unless its caller already gave up on it (asyncio.wrap_future cancels the future when
    the awaiting task is cancelled: a client that left). Once running, the future cannot be cancelled, so the
    outcome always has somewhere to go; and nothing about one caller's outcome may end the loop."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        try:
            result = fn()
        except Exception as exc:  # handed to the awaiting caller
            future.set_exception(exc)
        else:
            future.set_result(result)
    except Exception:
        log.exception("the result of an engine call could not be handed to its caller")


def _put_all(batch: list[tuple[str, OutputMailbox, object]]) -> None:
    """On the callers' event loop. Each output is handed over on its own: a stream that cannot take one must not
    keep the others of the step from theirs."""
    for request_id, mailbox, item in batch:
        try:
            if isinstance(item, BaseException):
                mailbox.fail(item)
            else:
                mailbox.put(item)
        except Exception as exc:
            log.exception("the output of request %s could not be handed to its stream", request_id)
            # Its reader ends with the error (and aborts the request) rather than waiting for outputs.
            mailbox.fail(EngineError(f"the engine's output could not be delivered: {exc!r}"))
