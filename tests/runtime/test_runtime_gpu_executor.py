"""The GPU executor's logic that needs no GPU: graph ladder and padding, KV-cache sizing, backend
selection and flags, device sampling, tensor-parallel sharding. Tests that need CUDA (or
flash-attn) are marked `gpu` and skip with the reason on the CPU."""
import random

import pytest
import torch

from sluice_runtime.engine_config import ATTENTION_BACKENDS, EngineConfig
from sluice_runtime.executor.attention import BACKENDS, TorchAttentionBackend, select_backend
from sluice_runtime.executor.attention.base import SequenceSpan
from sluice_runtime.executor.cuda_graphs import graph_batch_sizes, pad_decode_batch, padded_batch_size
from sluice_runtime.executor.device_sampler import DeviceSampler
from sluice_runtime.executor.memory import MemoryProfile, plan_kv_cache_blocks
from sluice_runtime.executor.sampler import Sampler, SampleRequest
from sluice_runtime.layers.linear import ColumnParallelLinear, RowParallelLinear, TensorParallel
from sluice_runtime.model_load_error import ModelLoadError
from sluice_runtime.sampling_params import SamplingParams

GiB = 2**30
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# -- CUDA-graph ladder and padding ------------------------------------------------------------------


def test_graph_ladder_covers_every_batch_with_little_padding():
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = graph_batch_sizes(256)
    for n in range(1, 257):
        size = padded_batch_size(n, sizes)
        assert n <= size <= max(n + 15, 2 * n - 1)
    assert padded_batch_size(257, sizes) is None


def test_padding_rows_write_nowhere_and_read_nothing():
    spans = [SequenceSpan(0, 1, 6, [3, 9]), SequenceSpan(1, 1, 1, [5])]
    padded = pad_decode_batch([11, 12], [5, 0], spans, size=4, max_blocks=3, block_size=4, pin=False)
    assert padded.input_ids.tolist() == [11, 12, 0, 0]
    assert padded.positions.tolist() == [5, 0, 0, 0]
    assert padded.slot_mapping.tolist() == [9 * 4 + 1, 5 * 4, -1, -1]
    assert padded.context_lens.tolist() == [6, 1, 0, 0]
    assert padded.block_tables.tolist() == [[3, 9, 0], [5, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert padded.block_tables.dtype == torch.int32


# -- KV-cache sizing ------------------------------------------------------------------------------


def _profile(weights=2 * GiB, activations=GiB // 2, other=GiB // 2, total=80 * GiB):
    return MemoryProfile(total=total, weights=weights, activations=activations, other=other)


def test_kv_cache_gets_what_the_utilization_leaves():
    block = 2 * 16 * 16 * 8 * 64 * 2  # K and V, 16 layers, 16 tokens, 8 heads, dim 64, bf16
    blocks = plan_kv_cache_blocks(_profile(), 0.9, block, 16, 8192, None, graph_reserve=0)
    assert blocks == (int(80 * GiB * 0.9) - 3 * GiB) // block
    with_graphs = plan_kv_cache_blocks(_profile(), 0.9, block, 16, 8192, None, graph_reserve=GiB // 2)
    assert with_graphs == (int(80 * GiB * 0.9) - 3 * GiB - GiB // 2) // block
    # --kv-cache-memory caps it.
    assert plan_kv_cache_blocks(_profile(), 0.9, block, 16, 8192, 4 * GiB, graph_reserve=0) == 4 * GiB // block


def test_a_model_that_does_not_fit_is_refused_in_one_line():
    with pytest.raises(ModelLoadError) as info:
        plan_kv_cache_blocks(_profile(weights=75 * GiB), 0.9, 1 << 20, 16, 8192, None, graph_reserve=0)
    message = str(info.value)
    assert "does not fit" in message and "--gpu-memory-utilization 0.9" in message and "\n" not in message
    assert "weights 75.00 GiB" in message and "--tensor-parallel-size" in message


def test_a_cache_too_small_for_one_sequence_is_refused():
    with pytest.raises(ModelLoadError, match="cannot hold one sequence of --max-model-len 131072"):
        plan_kv_cache_blocks(_profile(), 0.9, 1 << 26, 16, 131072, None, graph_reserve=0)
    with pytest.raises(ModelLoadError, match="or --kv-cache-memory"):
        plan_kv_cache_blocks(_profile(), 0.9, 1 << 20, 16, 8192, 1 << 20, graph_reserve=0)


# -- backend selection and flags ------------------------------------------------------------------


def test_backend_names_agree_and_auto_is_torch_on_the_cpu():
    assert ATTENTION_BACKENDS == BACKENDS
    assert isinstance(select_backend("cpu"), TorchAttentionBackend)
    assert isinstance(select_backend("cpu", "torch", torch.bfloat16), TorchAttentionBackend)


@pytest.mark.parametrize("name,device,dtype,message", [
    ("triton", "cpu", torch.float32, "triton needs --device cuda"),
    ("flash-attn", "cpu", torch.bfloat16, "flash-attn runs only on CUDA"),
    ("flash-attn", "cuda", torch.float32, "float16 or bfloat16"),
    ("nope", "cpu", torch.float32, "unknown attention backend 'nope'"),
])
def test_unusable_backends_are_refused_with_the_reason(name, device, dtype, message, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ModelLoadError, match=message):
        select_backend(device, name, dtype)


def test_gpu_flags_parse_and_validate():
    import argparse

    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    config = EngineConfig.from_cli_args(parser.parse_args([
        "--attention-backend", "triton", "--enforce-eager", "--gpu-memory-utilization", "0.5",
        "--tensor-parallel-size", "2", "--kv-cache-memory", "2GiB"]))
    assert (config.attention_backend, config.enforce_eager, config.gpu_memory_utilization,
            config.tensor_parallel_size, config.kv_cache_memory) == ("triton", True, 0.5, 2, 2 * GiB)
    defaults = EngineConfig.from_cli_args(parser.parse_args([]))
    assert (defaults.attention_backend, defaults.enforce_eager, defaults.gpu_memory_utilization,
            defaults.tensor_parallel_size, defaults.kv_cache_memory) == ("auto", False, 0.9, 1, None)
    for bad, message in [({"gpu_memory_utilization": 0}, "gpu memory utilization must be in"),
                         ({"gpu_memory_utilization": 1.5}, "gpu memory utilization must be in"),
                         ({"tensor_parallel_size": 0}, "tensor parallel size must be at least 1"),
                         ({"attention_backend": "xformers"}, "attention backend must be one of")]:
        with pytest.raises(ValueError, match=message):
            EngineConfig(**bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_device_without_cuda_is_a_clear_load_error(tiny_model_dir):
    from sluice_runtime.executor.model_runner import ModelRunner

    with pytest.raises(ModelLoadError, match="--device cuda, but torch sees no CUDA device"):
        ModelRunner(tiny_model_dir, EngineConfig(device="cuda"))


# -- sampling on the device -----------------------------------------------------------------------


def _request(**params) -> SampleRequest:
    return SampleRequest(SamplingParams(**params), [1, 2, 3], [4], None, [], None)


def test_device_sampler_agrees_with_the_host_sampler():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    host = Sampler(0)
    device = DeviceSampler(host, torch.device("cpu"), seed=0)
    requests = [_request(temperature=0), _request(temperature=0, repetition_penalty=1.3),
                _request(temperature=0.7, top_k=1), _request(temperature=0, logprobs=2),
                _request(temperature=1.0, top_p=1e-6), _request(temperature=0, presence_penalty=2.0)]
    results = device(logits.clone(), requests)
    expected = host(logits.clone(), requests)
    assert [r.token_id for r in results] == [r.token_id for r in expected]
    # Rows needing host state went through the host sampler: logprobs came back.
    assert results[3].logprob is not None and len(results[3].top_logprobs) == 2


def test_device_sampling_draws_from_the_truncated_distribution():
    logits = torch.tensor([[3.0, 2.9, 2.8, -5.0, -5.0]]).repeat(400, 1)
    sampler = DeviceSampler(Sampler(0), torch.device("cpu"), seed=1)
    tokens = [r.token_id for r in sampler(logits, [_request(temperature=1.0, top_k=2)] * 400)]
    assert set(tokens) == {0, 1}
    assert 120 < tokens.count(1) < 280


# -- tensor-parallel sharding ---------------------------------------------------------------------


@pytest.mark.parametrize("heads,kv_heads,size", [(4, 2, 2), (8, 2, 4), (9, 3, 3), (4, 1, 2)])
def test_qkv_shards_hold_each_ranks_heads_and_rebuild_the_full_projection(heads, kv_heads, size):
    dim, hidden = 4, 8
    parts = [(heads, dim), (kv_heads, dim), (kv_heads, dim)]
    full = torch.randn((heads + 2 * kv_heads) * dim, hidden)
    x = torch.randn(3, hidden)
    q_full, k_full, v_full = (x @ full.T).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q_parts = []
    for rank in range(size):
        layer = ColumnParallelLinear(hidden, parts, False, TensorParallel(rank, size))
        shard = layer.shard(full)
        assert shard.shape == layer.weight.shape
        kv_size = max(1, kv_heads // size) * dim
        local_q, local_k, _ = (x @ shard.T).split([heads // size * dim, kv_size, kv_size], dim=-1)
        q_parts.append(local_q)
        # The rank's KV head is the one its first query head reads (GQA group), replicated if need be.
        kv_head = (rank * heads // size) // (heads // kv_heads)
        torch.testing.assert_close(local_k[:, :dim], k_full[:, kv_head * dim:(kv_head + 1) * dim])
    torch.testing.assert_close(torch.cat(q_parts, dim=-1), q_full)


def test_row_parallel_shards_sum_to_the_full_product():
    full = torch.randn(6, 8)
    x = torch.randn(3, 8)
    total = sum(x[:, rank * 4:(rank + 1) * 4] @ RowParallelLinear(4, 2, 6, False, TensorParallel(rank, 2)).shard(full).T
                for rank in range(2))
    torch.testing.assert_close(total, x @ full.T)


# -- GPU only -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash-attn needs a CUDA device (and is not installed here)")
def test_flash_attn_backend_matches_torch_with_prefix_hits():
    pytest.importorskip("flash_attn", reason="flash-attn is not installed")
    from sluice_runtime.executor.attention.flash_backend import FlashAttentionBackend

    _compare_with_torch(FlashAttentionBackend(), torch.bfloat16, block_size=256)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_compiled_triton_backend_matches_torch(dtype):
    from sluice_runtime.executor.attention.triton_backend import TritonAttentionBackend

    _compare_with_torch(TritonAttentionBackend(torch.device("cuda")), dtype, block_size=16)


def _compare_with_torch(backend, dtype, block_size):
    rng = random.Random(0)
    cuda = torch.device("cuda")
    hq, hk, d, num_blocks = 32, 8, 128, 4096 // block_size * 4
    free = list(range(num_blocks))
    rng.shuffle(free)
    decodes, prefills, start = [], [], 0
    for ctx in (1, 700, 4000):
        decodes.append(SequenceSpan(start, 1, ctx, [free.pop() for _ in range(-(-ctx // block_size))]))
        start += 1
    for ctx, new in ((300, 300), (3000, 100), (1000, 512)):
        prefills.append(SequenceSpan(start, new, ctx, [free.pop() for _ in range(-(-ctx // block_size))]))
        start += new
    q = torch.randn(start, hq, d, dtype=dtype, device=cuda)
    k, v = torch.randn(start, hk, d, dtype=dtype, device=cuda), torch.randn(start, hk, d, dtype=dtype, device=cuda)
    caches = [torch.randn(num_blocks * block_size, hk, d, dtype=dtype, device=cuda) for _ in range(2)]
    reference = TorchAttentionBackend()
    ref_caches = [c.clone() for c in caches]
    expected = reference.forward(q, k, v, *ref_caches, reference.build_metadata(decodes, prefills, block_size, cuda, None),
                                 d ** -0.5)
    out = backend.forward(q, k, v, *caches, backend.build_metadata(decodes, prefills, block_size, cuda, None), d ** -0.5)
    tolerance = 2e-2 if dtype != torch.float32 else 1e-4
    torch.testing.assert_close(out.float(), expected.float(), atol=tolerance, rtol=tolerance)
    assert all(torch.equal(a, b) for a, b in zip(caches, ref_caches))


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_decode_matches_eager_and_memory_is_sized(tiny_model_dir):
    from sluice_runtime.engine.llm import LLM

    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    prompts = [[100 + i] * (5 + 7 * i) for i in range(5)]
    outputs = []
    for eager in (True, False):
        llm = LLM(str(tiny_model_dir), device="cuda", dtype="bfloat16", enforce_eager=eager, max_num_seqs=8,
                  kv_cache_memory="1GiB")
        assert (llm.engine.runner.graphs is None) == eager
        outputs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
    assert outputs[0] == outputs[1]
    with pytest.raises(ModelLoadError, match="does not fit"):
        LLM(str(tiny_model_dir), device="cuda", gpu_memory_utilization=1e-6)
