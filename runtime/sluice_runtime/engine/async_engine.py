"""The engine loop on its own thread, with an asyncio API for the server."""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import Future

from .config import EngineConfig
from .errors import EngineDead
from .llm_engine import EngineStats, LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams

log = logging.getLogger(__name__)


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_info = engine.model_info
        self.config = engine.config
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
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
        return self._thread.is_alive() and self.error is None

    # -- requests -------------------------------------------------------------------------------

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str, *,
                       priority: int = 0, deadline: float | None = None) -> AsyncIterator[RequestOutput]:
        if not self.is_running:
            raise EngineDead(f"the engine loop is not running: {self.error!r}")
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), queue)
        try:
            self.engine.add_request(request_id, prompt_token_ids, params, priority, deadline)
        except BaseException:
            self._streams.pop(request_id, None)
            raise
        self._wake.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
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

    async def embed(self, prompt_token_ids: list[int]) -> list[float]:
        if len(prompt_token_ids) > self.engine.max_model_len:
            raise ValueError(f"the input has {len(prompt_token_ids)} tokens but the model's context length is "
                             f"{self.engine.max_model_len}")
        return await asyncio.wrap_future(self._call(lambda: self.engine.runner.embed(prompt_token_ids)))

    def _call(self, fn) -> Future:
        """Run fn on the engine thread between steps, so torch is never used from two threads."""
        future: Future = Future()
        self._calls.append((fn, future))
        self._wake.set()
        return future

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
                        fn, future = self._calls.popleft()
                        try:
                            future.set_result(fn())
                        except Exception as exc:  # handed to the awaiting caller
                            future.set_exception(exc)
                    if not self.engine.has_unfinished_requests():
                        self._wake.wait(timeout=0.5)
                        self._wake.clear()
                        continue
                    for output in self.engine.step():
                        self._deliver(output.request_id, output)
            except BaseException as exc:
                log.exception("engine loop crashed")
                self.error = exc
                for request_id in list(self._streams):
                    self._deliver(request_id, EngineDead(f"the engine loop crashed: {exc!r}"))

    def _deliver(self, request_id: str, item) -> None:
        target = self._streams.get(request_id)
        if target is None:
            return
        loop, queue = target
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:
            # The caller's event loop is closed; nobody is listening any more.
            self.engine.abort(request_id)
