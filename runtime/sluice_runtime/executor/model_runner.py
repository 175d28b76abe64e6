"""Owns the model weights and the KV cache; runs one packed forward per engine step.

On CUDA it also picks the attention kernels, sizes the KV cache from what a maximal step leaves
of --gpu-memory-utilization, captures decode steps in CUDA graphs and samples on the device.
With --tensor-parallel-size N this process is rank 0: it starts ranks 1..N-1, which hold the
other shards of every layer and run each step alongside it; only rank 0 computes logits.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sluice_contracts.runtime_flags import DEFAULT_CPU_KV_CACHE_MEMORY

from ..cpu_isa import CpuIsaError, CpuPaths, cpu_paths
from ..engine_config import EngineConfig, parse_memory
from ..layers import fused_cpu
from ..layers.linear import TensorParallel
from ..model_load_error import ModelLoadError
from ..models.config import ModelConfig
from ..models.llama import LlamaForCausalLM
from ..models.weights import load_weights
from . import distributed, int8_linear
from .attention import AttentionMetadata, SequenceSpan, TorchAttentionBackend, native_cpu, select_backend
from .cpu_budget import usable_cpus
from .cuda_graphs import DecodeGraphs, cuda_graph_capture, graph_batch_sizes
from .device_sampler import DeviceSampler
from .lora_slots import LoraSlots
from .memory import plan_kv_cache_blocks, profile_cuda_memory
from .packed_linear import prepare_linears
from .sampler import Sampler, SampleRequest, SampleResult
from .transfer import to_device

log = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE = parse_memory(DEFAULT_CPU_KV_CACHE_MEMORY)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto': bfloat16 where the hardware computes it natively (CUDA with bf16 support; CPUs with
    AVX512-BF16 or AMX: 2.4x float32's throughput in the serve bench there), float32 elsewhere."""
    if name != "auto":
        return getattr(torch, name)  # EngineConfig admits only torch's own dtype names besides auto
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if host_cpu_paths().fast_bf16 else torch.float32


def host_cpu_paths() -> CpuPaths:
    """The CPU paths (cpu_isa), a bad SLUICE_CPU_ISA refused as a start-up error."""
    try:
        return cpu_paths()
    except CpuIsaError as exc:
        raise ModelLoadError(str(exc)) from None


@dataclass
class BatchItem:
    """One sequence's work in a step: compute `token_ids` starting at `start_pos`."""

    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sample: SampleRequest | None  # set when the last token's logits are sampled
    lora_id: int = 0  # the LoRA adapter the tokens run with; 0: the base model
    # A speculative verification's requests for the rows before the last, one per draft token (what the target
    # picks after the token before each draft); their results come before the last row's.
    verify: list[SampleRequest] = field(default_factory=list)


@dataclass
class StepInputs:
    """A packed step as every rank runs it (no sampling state, so it pickles small)."""

    input_ids: list[int]
    positions: list[int]
    decodes: list[SequenceSpan]
    prefills: list[SequenceSpan]
    sample_rows: list[int]


class ModelRunner:
    def __init__(self, model_dir: Path, config: EngineConfig, rank: int = 0, port: int | None = None):
        self.engine_config = config
        self.rank = rank
        self.cfg = ModelConfig.from_hf(json.loads((model_dir / "config.json").read_text()))
        self.max_model_len = config.max_model_len or self.cfg.max_position_embeddings
        if self.max_model_len > self.cfg.max_position_embeddings and not self.cfg.rope_scaling:
            raise ModelLoadError(
                f"--max-model-len {self.max_model_len} exceeds the model's context of "
                f"{self.cfg.max_position_embeddings} tokens")
        self.tp = TensorParallel(rank, config.tensor_parallel_size)
        _check_shardable(self.cfg, self.tp.size)
        if config.enable_lora and self.tp.size > 1:
            # A row-parallel layer's deltas would need an all-reduce of their own.
            raise ModelLoadError("--enable-lora is not supported with --tensor-parallel-size above 1")
        self.device = _device(config.device, rank, self.tp.size)
        # Read once, before anything is loaded: a SLUICE_CPU_ISA this CPU cannot run is refused here.
        self.cpu_paths = host_cpu_paths() if self.device.type == "cpu" else None
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.workers: distributed.WorkerGroup | None = None
        if self.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # torch's own default (the cores it may run on), capped by a pod's CPU limit; an explicit
            # OMP_NUM_THREADS wins.
            torch.set_num_threads(min(torch.get_num_threads(), usable_cpus()))
        self.num_threads = torch.get_num_threads()
        if self.tp.size > 1 and rank == 0:
            self.workers = distributed.WorkerGroup(run_worker, (model_dir, config), self.tp.size)
            port = self.workers.port
            weakref.finalize(self, self.workers.close)
        try:
            self._start(model_dir, port)
        except BaseException:
            self.close()
            raise

    def _start(self, model_dir: Path, port: int | None) -> None:
        if self.tp.size > 1:
            self._join_ranks(port)
        torch.manual_seed(self.engine_config.seed)
        self.model = self._load_model(model_dir)
        # Embeddings run without a KV cache, which only the reference backend handles.
        self.reference_backend = TorchAttentionBackend()
        # Counted before quantization, which unties a tied LM head from its embedding.
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        self.weight_bytes, self.linears = self._prepare_weights(model_dir)
        # Wrapped before the KV cache is sized and graphs are captured, so both count the slots.
        self.lora = (LoraSlots(self.model, self.cfg, self.engine_config.max_loras, self.engine_config.max_lora_rank)
                     if self.engine_config.enable_lora else None)
        self.backend = select_backend(self.device, self.engine_config.attention_backend, self.dtype, self.cfg.head_dim)
        use_graphs = self._allocate_kv_cache()
        self.graphs = self._capture_graphs() if use_graphs else None
        self.sampler = Sampler(self.engine_config.seed)
        self.device_sampler = (DeviceSampler(self.sampler, self.device, self.engine_config.seed)
                               if self.device.type == "cuda" else None)
        if self.rank == 0:
            self._log_start(self.linears)

    # -- start-up -----------------------------------------------------------------------------------

    def _join_ranks(self, port: int | None) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:
            # The ranks share this machine's cores; each would otherwise start a thread per core.
            torch.set_num_threads(max(1, usable_cpus() // self.tp.size))
        distributed.init_process_group(self.rank, self.tp.size, port, self.device)

    def _load_model(self, model_dir: Path) -> LlamaForCausalLM:
        with torch.device("meta"):
            model = LlamaForCausalLM(self.cfg, self.max_model_len, self.tp)
        model = model.to_empty(device=self.device).to(self.dtype)
        # Rotary tables are computed, not loaded; rebuild them on the real device in float32.
        model.rotary = type(model.rotary)(self.cfg.head_dim, self.max_model_len, self.cfg.rope_theta,
                                          self.cfg.rope_scaling).to(self.device)
        if self.cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        error = None
        try:
            load_weights(model, model_dir, self.dtype)
        except ModelLoadError as exc:
            error = str(exc)
        self._agree(error)
        return model.eval()

    def _prepare_weights(self, model_dir: Path) -> tuple[int, str | None]:
        """Quantizes the weights (--quantization) or packs them for this CPU; returns the weights' resident
        bytes and how the linears compute."""
        plain = self._resident_bytes()
        if self.engine_config.quantization == "int8":
            kernel = int8_linear.choose_kernel(self.device, self.cpu_paths.level if self.cpu_paths else None)
            peaks = None
            if kernel == int8_linear.DYNAMIC:
                with torch.inference_mode(), int8_linear.input_peaks(self.model) as peaks:
                    self.model.logits(self._embed([int8_linear.calibration_ids(model_dir)]))
            stored = int8_linear.quantize_model(self.model, kernel, peaks)
            return self._resident_bytes() + stored, kernel
        linears = None
        if self.cpu_paths is not None:
            linears, _ = prepare_linears(self.model, {torch.bfloat16: self.cpu_paths.onednn_bf16,
                                                      torch.float16: self.cpu_paths.onednn_fp16,
                                                      torch.float32: self.cpu_paths.onednn_fp32})
            linears = linears and f"{str(self.dtype)[6:]} linears {linears}"
        # A packed copy takes its weight's place and size.
        return plain, linears

    def _resident_bytes(self) -> int:
        """Bytes of the model's parameters that hold memory (a shared one once, a shape-only stand-in none)."""
        storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in self.model.parameters()}
        return sum(storages.values())

    def _allocate_kv_cache(self) -> bool:
        """Sizes and allocates the KV cache; returns whether decode steps run in CUDA graphs."""
        multiple = self.backend.block_size_multiple
        self.block_size = -(-self.engine_config.block_size // multiple) * multiple
        if self.block_size != self.engine_config.block_size:
            log.info("the %s attention backend reads KV-cache blocks of a multiple of %d tokens: block size %d -> %d",
                     self.backend.name, multiple, self.engine_config.block_size, self.block_size)
        use_graphs = (self.device.type == "cuda" and self.backend.supports_cuda_graphs
                      and not self.engine_config.enforce_eager)
        self.num_blocks = self._kv_cache_blocks(use_graphs)
        shape = (self.num_blocks * self.block_size, self.model.layers[0].self_attn.num_kv_heads, self.cfg.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                           torch.zeros(shape, dtype=self.dtype, device=self.device))
                          for _ in range(self.cfg.num_layers)]
        return use_graphs

    def _log_start(self, linears: str | None) -> None:
        log.info("model %s: %d layers, %.1fM parameters%s, %s on %s; weights %.0f MiB; attention %s%s; KV cache %d "
                 "blocks x %d tokens (%.0f MiB%s)", self.cfg.architecture, self.cfg.num_layers,
                 self.num_parameters / 1e6, f" per rank x {self.tp.size}" if self.tp.size > 1 else "",
                 str(self.dtype)[6:], self.device, self.weight_bytes / 2**20, self.backend.name,
                 f", CUDA graphs for batches up to {self.graphs.sizes[-1]}" if self.graphs else "",
                 self.num_blocks, self.block_size, self.num_blocks * self.bytes_per_block / 2**20,
                 " per rank" if self.tp.size > 1 else "")
        if self.cpu_paths is not None:
            self._log_cpu_paths(self.cpu_paths, linears)
        elif linears:
            log.info("linears: %s", linears)

    def _log_cpu_paths(self, paths: CpuPaths, linears: str | None) -> None:
        decode = (native_cpu.kernel_name() if native_cpu.supports(self.dtype, self.device, self.cfg.head_dim)
                  else "torch (gathered blocks)")
        parts = [f"CPU {paths.describe()}", f"decode attention {decode}",
                 f"norm and rotary {'native' if fused_cpu.applies(self.dtype, self.device) else 'torch'}"]
        if linears:
            parts.append(linears)
        log.info("; ".join(parts))
        if self.dtype == torch.bfloat16 and not paths.fast_bf16:
            log.warning("--dtype bfloat16 on a CPU without AVX512-BF16 or AMX: matmuls compute in float32, a little "
                        "slower than --dtype float32 and only saving memory; --dtype auto picks float32 here")

    def _agree(self, error: str | None, value: int = 0) -> list[int]:
        """Exchange a start-up result with the other ranks: all raise if any failed, else every value."""
        results = distributed.all_gather((error, value)) if self.tp.size > 1 else [(error, value)]
        for rank, (problem, _) in enumerate(results):
            if problem:
                raise ModelLoadError(problem if self.tp.size == 1 else f"tensor-parallel rank {rank}: {problem}")
        return [v for _, v in results]

    @property
    def bytes_per_block(self) -> int:
        """KV-cache bytes of one block on this rank (its share of the KV heads)."""
        element = torch.tensor([], dtype=self.dtype).element_size()
        heads = self.model.layers[0].self_attn.num_kv_heads
        return 2 * self.cfg.num_layers * self.block_size * heads * self.cfg.head_dim * element

    def _kv_cache_blocks(self, use_graphs: bool) -> int:
        config = self.engine_config
        if config.num_kv_blocks:
            return config.num_kv_blocks
        requested = None if config.kv_cache_memory is None else config.kv_cache_memory // self.tp.size
        if self.device.type != "cuda":
            return max(1, (requested or DEFAULT_CPU_KV_CACHE // self.tp.size) // self.bytes_per_block)
        profile = profile_cuda_memory(self.device, self._run_maximal_step)
        error, blocks = None, 0
        try:
            # The graphs' memory pool holds at most one decode batch's activations, well under a maximal step's.
            blocks = plan_kv_cache_blocks(profile, config.gpu_memory_utilization, self.bytes_per_block, self.block_size,
                                          self.max_model_len, requested, profile.activations if use_graphs else 0)
        except ModelLoadError as exc:
            error = str(exc)
        # Every rank holds the same blocks, so the smallest device decides.
        return min(self._agree(error, blocks))

    @torch.inference_mode()
    def _run_maximal_step(self) -> None:
        """The most a step can hold: max_num_batched_tokens of prefill, max_num_seqs rows sampled."""
        tokens = self.engine_config.max_num_batched_tokens
        lengths = [min(self.max_model_len, tokens - start) for start in range(0, tokens, self.max_model_len)]
        spans, start = [], 0
        for n in lengths:
            spans.append(SequenceSpan(start, n, n, []))
            start += n
        meta = AttentionMetadata(num_decodes=0, prefills=spans, slot_mapping=torch.empty(0, dtype=torch.long),
                                 prefill_context=[None] * len(spans))
        positions = torch.cat([torch.arange(n) for n in lengths]).to(self.device)
        hidden = self.model.hidden_states(torch.zeros(tokens, dtype=torch.long, device=self.device), positions,
                                          self.reference_backend, meta, None)
        logits = self.model.logits(hidden[:min(self.engine_config.max_num_seqs, tokens)])
        # What top-k/top-p sampling allocates on top of the logits.
        logits.sort(dim=-1, descending=True)[0].softmax(dim=-1).cumsum(dim=-1)

    def _capture_graphs(self) -> DecodeGraphs:
        def forward(input_ids, positions, meta):
            return self.model.hidden_states(input_ids, positions, self.backend, meta, self.kv_caches)

        with torch.inference_mode():
            return DecodeGraphs(forward, graph_batch_sizes(self.engine_config.max_num_seqs), self.max_model_len,
                                self.block_size, self.cfg.sliding_window, self.cfg.hidden_size, self.dtype,
                                self.device, cuda_graph_capture())

    # -- steps --------------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, decodes: list[BatchItem], prefills: list[BatchItem],
                interrupt: threading.Event | None = None) -> list[SampleResult]:
        """Run one packed forward of `decodes` (a token each, or a verification's token and drafts) and prompt
        chunks; returns one result per sampled row (an item's verify rows, then its sample), in order. Setting
        `interrupt` abandons the forward before its next layer (ForwardInterrupted), except where tensor-parallel
        ranks run it too (each must run every layer's collectives) or a captured graph replays it whole."""
        step = StepInputs([], [], [], [], [])
        sample_requests: list[SampleRequest] = []
        for i, item in enumerate(decodes + prefills):
            start = len(step.input_ids)
            step.input_ids.extend(item.token_ids)
            step.positions.extend(range(item.start_pos, item.start_pos + len(item.token_ids)))
            if i < len(decodes):
                # A verification's rows are decodes, each over the context up to its own token, which the step
                # writes to the cache before attention reads it: the paged decode kernels read that context in
                # place, where a chunk's would be gathered out of the cache in every layer.
                step.decodes.extend(SequenceSpan(start + j, 1, item.start_pos + j + 1, item.block_table)
                                    for j in range(len(item.token_ids)))
            else:
                step.prefills.append(SequenceSpan(start, len(item.token_ids), item.start_pos + len(item.token_ids),
                                                  item.block_table))
            if item.sample is not None:
                end = len(step.input_ids)
                step.sample_rows.extend(range(end - 1 - len(item.verify), end))
                sample_requests.extend([*item.verify, item.sample])
        if self.workers is not None:
            self.workers.send(("step", step))
            interrupt = None
        with_lora = self.lora is not None and self.lora.set_step(
            [(item.lora_id, len(item.token_ids)) for item in decodes + prefills], len(step.input_ids), self.device)
        try:
            hidden = self._forward(step, with_lora, interrupt)
        finally:
            if self.lora is not None:
                self.lora.clear_step()
        if not step.sample_rows:
            return []
        logits = self.model.logits(hidden[to_device(step.sample_rows, torch.long, self.device)])
        if self.device_sampler is not None:
            return self.device_sampler(logits, sample_requests)
        return self.sampler(logits.cpu(), sample_requests)

    def _forward(self, step: StepInputs, with_lora: bool = False,
                 interrupt: threading.Event | None = None) -> torch.Tensor:
        # Graphs were captured without LoRA rows; a step with adapters runs eagerly.
        if self.graphs is not None and not step.prefills and not with_lora:
            hidden = self.graphs.run(step.input_ids, step.positions, step.decodes)
            if hidden is not None:
                return hidden
        meta = self.backend.build_metadata(step.decodes, step.prefills, self.block_size, self.device,
                                           self.cfg.sliding_window)
        return self.model.hidden_states(
            to_device(step.input_ids, torch.long, self.device), to_device(step.positions, torch.long, self.device),
            self.backend, meta, self.kv_caches, interrupt)

    @torch.inference_mode()
    def embed(self, batch: list[list[int]], dimensions: int | None = None) -> list[list[float]]:
        """One packed forward over every prompt of `batch`, without the KV cache: each prompt's final hidden
        states pooled (--pooling), cut to `dimensions` and L2-normalized."""
        if self.workers is not None:
            self.workers.send(("embed", batch))
        hidden = self._embed(batch)
        lengths = torch.tensor([len(ids) for ids in batch], device=hidden.device)
        if self.engine_config.pooling == "last":
            pooled = hidden[lengths.cumsum(0) - 1].float()
        else:
            rows = torch.repeat_interleave(torch.arange(len(batch), device=hidden.device), lengths)
            sums = torch.zeros(len(batch), hidden.shape[1], dtype=torch.float32, device=hidden.device)
            pooled = sums.index_add_(0, rows, hidden.float()) / lengths[:, None]
        return torch.nn.functional.normalize(pooled[:, :dimensions], dim=1).cpu().tolist()

    def _embed(self, batch: list[list[int]]) -> torch.Tensor:
        spans, start = [], 0
        for ids in batch:
            spans.append(SequenceSpan(start, len(ids), len(ids), []))
            start += len(ids)
        meta = AttentionMetadata(num_decodes=0, prefills=spans, slot_mapping=torch.empty(0, dtype=torch.long),
                                 prefill_context=[None] * len(spans))
        positions = [p for ids in batch for p in range(len(ids))]
        return self.model.hidden_states(to_device([t for ids in batch for t in ids], torch.long, self.device),
                                        to_device(positions, torch.long, self.device), self.reference_backend,
                                        meta, None)

    # -- tensor-parallel workers ----------------------------------------------------------------------

    def follow(self, pipe) -> None:
        """A worker rank's loop: run what rank 0 sends until it says stop or goes away."""
        with torch.inference_mode():
            while True:
                try:
                    message = pipe.recv()
                except EOFError:
                    return
                if message is None:
                    return
                kind, payload = message
                if kind == "step":
                    self._forward(payload)
                else:
                    self._embed(payload)

    def close(self) -> None:
        """Stop the tensor-parallel workers (rank 0), leave the process group, give the cores back."""
        if self.workers is not None:
            self.workers.close()
        if self.tp.size > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        torch.set_num_threads(self.num_threads)


def run_worker(model_dir: Path, config: EngineConfig, rank: int, port: int, pipe) -> None:
    """Entry point of tensor-parallel rank `rank` (a spawned process)."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s tp-rank{rank} %(name)s: %(message)s")
    pipe.send(distributed.WorkerGroup.STARTED)
    try:
        runner = ModelRunner(model_dir, config, rank, port)
    except ModelLoadError:
        return  # every rank raised the same error; rank 0 reports it
    runner.follow(pipe)
    runner.close()


def _check_shardable(cfg: ModelConfig, size: int) -> None:
    if size == 1:
        return
    problems = []
    if cfg.num_heads % size:
        problems.append(f"{cfg.num_heads} attention heads")
    if cfg.num_kv_heads % size and size % cfg.num_kv_heads:
        problems.append(f"{cfg.num_kv_heads} key/value heads (neither divisible by nor dividing it)")
    if cfg.intermediate_size % size:
        problems.append(f"an MLP width of {cfg.intermediate_size}")
    if problems:
        raise ModelLoadError(f"--tensor-parallel-size {size} does not divide this model's {' and '.join(problems)}")


def _device(name: str, rank: int, world_size: int) -> torch.device:
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ModelLoadError(f"--device {name}, but torch sees no CUDA device (CPU-only torch build or no GPU)")
    first, count = device.index or 0, torch.cuda.device_count()
    if first + world_size > count:
        raise ModelLoadError(f"--device {name} with --tensor-parallel-size {world_size} needs GPUs {first}.."
                             f"{first + world_size - 1}, but {count} are visible")
    return torch.device("cuda", first + rank)
