"""Tensor-parallel processes: rank 0 (the engine's own process) starts ranks 1..N-1 and drives them.

All ranks join one torch.distributed group (NCCL on CUDA, gloo on the CPU), meeting on a free
port of 127.0.0.1; the model's all-reduces run over it. Steps reach the workers over pipes, not
collectives: an idle worker then waits on its pipe with no collective timeout running, and when
rank 0 goes away the pipe ends and the worker exits.
"""
from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from ..model_load_error import ModelLoadError

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(rank: int, world_size: int, port: int, device: torch.device) -> None:
    torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                         init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)


def all_gather(value: Any) -> list[Any]:
    """Every rank's `value` (any picklable object), in rank order."""
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, value)
    return gathered


class WorkerGroup:
    """Ranks 1..world_size-1 as spawned processes running target(*args, rank, port, pipe).

    The target sends STARTED on its pipe before it joins the process group: a worker that dies
    before that (a bad environment, a script without a __main__ guard) is reported here instead of
    leaving rank 0 waiting for it at the rendezvous.
    """

    STARTED = "started"

    def __init__(self, target: Callable[..., None], args: tuple, world_size: int):
        context = mp.get_context("spawn")
        self.port = free_port()
        self.pipes = []
        self.processes = []
        for rank in range(1, world_size):
            ours, theirs = context.Pipe()
            process = context.Process(target=target, args=(*args, rank, self.port, theirs), daemon=True,
                                      name=f"sluice-tp-rank{rank}")
            process.start()
            theirs.close()
            self.pipes.append(ours)
            self.processes.append(process)
        for pipe, process in zip(self.pipes, self.processes):
            if not self._started(pipe, process):
                process.join(timeout=5)
                self.close()
                raise ModelLoadError(f"tensor-parallel worker {process.name} exited with code {process.exitcode} "
                                     "before starting (its error is above; a script must start the engine under "
                                     "`if __name__ == '__main__':`)")

    def _started(self, pipe, process) -> bool:
        try:
            while not pipe.poll(0.5):
                if not process.is_alive():
                    return False
            return pipe.recv() == self.STARTED
        except EOFError:
            return False

    def send(self, message: Any) -> None:
        for pipe in self.pipes:
            pipe.send(message)

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(None)
            except (BrokenPipeError, OSError):
                pass  # that worker is gone already
            pipe.close()
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                log.warning("tensor-parallel worker %s did not stop; terminating it", process.name)
                process.terminate()
                process.join(timeout=5)
        self.pipes, self.processes = [], []
