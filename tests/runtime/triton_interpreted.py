"""The Triton paged-attention kernels against the torch reference, on the CPU in Triton's interpreter.

Run by test_runtime_triton_attention.py in a fresh process with TRITON_INTERPRET=1 set from the
start: triton must be imported under that variable (torch imports it too, early), so it cannot
be switched on inside the main test process. Shapes stay small: the interpreter runs every
program of the grid in Python. The interpreter miscomputes tl.dot on bfloat16, so dtypes here are
float32 and float16 (a GPU test covers bfloat16).
"""
import os
import random

import pytest
import torch

from sluice_runtime.executor.attention.base import SequenceSpan
from sluice_runtime.executor.attention.torch_backend import TorchAttentionBackend

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 from process start (see test_runtime_triton_attention.py)",
                allow_module_level=True)

HQ, HK, D = 4, 2, 16
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def kernels():
    from sluice_runtime.executor.attention import triton_kernels

    return triton_kernels


@pytest.fixture(scope="module")
def triton_backend():
    from sluice_runtime.executor.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend(CPU)


def _batch(rng: random.Random, block_size: int, num_decodes: int, prefill_shapes: list[tuple[int, int]],
           max_decode_context: int, num_blocks: int):
    """Decodes then prefills (context, new tokens), on shuffled blocks; returns spans and token count."""
    free = list(range(num_blocks))
    rng.shuffle(free)
    decodes, prefills, start = [], [], 0
    for _ in range(num_decodes):
        ctx = rng.randint(1, max_decode_context)
        decodes.append(SequenceSpan(start, 1, ctx, [free.pop() for _ in range(-(-ctx // block_size))]))
        start += 1
    for ctx, new in prefill_shapes:
        prefills.append(SequenceSpan(start, new, ctx, [free.pop() for _ in range(-(-ctx // block_size))]))
        start += new
    return decodes, prefills, start


def _qkv(tokens: int, dtype: torch.dtype):
    """q, k, v as the model makes them: k and v are strided views of one fused projection."""
    qkv = torch.randn(tokens, (HQ + 2 * HK) * D, dtype=dtype)
    q, k, v = qkv.split([HQ * D, HK * D, HK * D], dim=-1)
    return q.reshape(tokens, HQ, D), k.view(tokens, HK, D), v.view(tokens, HK, D)


def test_kv_write_reads_strided_rows_and_skips_padding(kernels):
    q, k, v = _qkv(5, torch.float32)
    k_cache, v_cache = torch.zeros(32, HK, D), torch.zeros(32, HK, D)
    kernels.store_kv_cache(k, v, k_cache, v_cache, torch.tensor([7, -1, 0, 31, -1]))
    for token, slot in [(0, 7), (2, 0), (3, 31)]:
        assert torch.equal(k_cache[slot], k[token]) and torch.equal(v_cache[slot], v[token])
    assert int((k_cache.abs().sum(dim=(1, 2)) > 0).sum()) == 3


@pytest.mark.parametrize("dtype,block_size,window", [
    (torch.float32, 16, None), (torch.float32, 4, None), (torch.float16, 16, None),
    (torch.float32, 1, 37), (torch.float16, 8, 100),
])
def test_mixed_batch_with_prefix_hits_matches_torch(triton_backend, dtype, block_size, window):
    rng = random.Random(block_size)
    torch.manual_seed(block_size)
    # Prefills: a fresh prompt, a prefix hit (most of the context cached), a later chunk, one token.
    decodes, prefills, tokens = _batch(rng, block_size, 3, [(45, 45), (300, 20), (130, 64), (9, 1)], 600,
                                       num_blocks=2048 // block_size)
    q, k, v = _qkv(tokens, dtype)
    num_slots = 2048
    k_cache, v_cache = torch.randn(num_slots, HK, D, dtype=dtype), torch.randn(num_slots, HK, D, dtype=dtype)
    reference = TorchAttentionBackend()
    ref_meta = reference.build_metadata(decodes, prefills, block_size, CPU, window)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    expected = reference.forward(q, k.contiguous(), v.contiguous(), ref_k, ref_v, ref_meta, D ** -0.5)

    meta = triton_backend.build_metadata(decodes, prefills, block_size, CPU, window)
    assert torch.equal(meta.slot_mapping, ref_meta.slot_mapping)
    out = triton_backend.forward(q, k, v, k_cache, v_cache, meta, D ** -0.5)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    tolerance = 2e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.float(), expected.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_split_kv_decode_merges_parts_and_leaves_padding_rows_zero(kernels, num_splits):
    rng = random.Random(num_splits)
    torch.manual_seed(num_splits)
    block_size = 16
    decodes, _, _ = _batch(rng, block_size, 4, [], 500, num_blocks=128)
    k_cache, v_cache = torch.randn(128 * block_size, HK, D), torch.randn(128 * block_size, HK, D)
    q = torch.randn(5, HQ, D)
    reference = TorchAttentionBackend()
    meta = reference.build_metadata(decodes, [], block_size, CPU, None)
    slots = meta.slot_mapping
    # The reference writes this step's keys; write the same ones so both read identical caches.
    new_k, new_v = k_cache[slots].clone(), v_cache[slots].clone()
    expected = reference.forward(q[:4], new_k, new_v, k_cache, v_cache, meta, D ** -0.5)

    # A fifth row padded as in a CUDA graph: context length 0, a zero block table row.
    tables = torch.zeros(5, meta.decode_block_tables.shape[1], dtype=torch.int32)
    tables[:4] = meta.decode_block_tables
    lens = torch.tensor([s.context_len for s in decodes] + [0], dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    kernels.paged_decode(q, k_cache, v_cache, tables, lens, block_size, D ** -0.5, None, num_splits, out)
    torch.testing.assert_close(out[:4], expected, atol=2e-5, rtol=2e-5)
    assert torch.equal(out[4], torch.zeros(HQ, D))


def test_decode_splits_fill_the_gpu_without_tiny_parts():
    from sluice_runtime.executor.attention.triton_backend import decode_splits

    assert decode_splits(1, 8, 4096, 132) == 16  # batch 1: as many parts as allowed
    assert decode_splits(256, 8, 4096, 132) == 1  # a big batch fills the GPU by itself
    assert decode_splits(1, 8, 300, 132) == 2  # short contexts are not cut below 256 tokens
    assert decode_splits(4, 2, 10, 1) == 1


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(100, 40000) for _ in range(20)]
    return [shared + [rng.randrange(100, 40000) for _ in range(rng.randint(1, 30))] for _ in range(6)]


def test_engine_on_triton_kernels_matches_torch(tiny_model_dir):
    """Chunked prefill, prefix hits (the second round) and decode through the engine, block size 4."""
    from sluice_runtime.engine.llm import LLM
    from sluice_runtime.sampling_params import SamplingParams

    prompts = _prompts(0)
    params = [SamplingParams(max_tokens=8, temperature=0 if i % 2 else 1.0, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    outputs = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(tiny_model_dir), attention_backend=backend, block_size=4, num_kv_blocks=200,
                  max_num_batched_tokens=32, max_num_seqs=4, max_model_len=256)
        rounds = [[o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] for _ in range(2)]
        assert llm.engine.block_manager.prefix_hits > 0
        outputs[backend] = rounds
    assert outputs["triton"] == outputs["torch"]


def test_padded_graph_decode_matches_eager(tiny_model_dir):
    """The CUDA-graph decode path (static buffers, padding to the ladder) on the CPU, replayed eagerly."""
    from sluice_runtime.engine_config import EngineConfig
    from sluice_runtime.executor.cuda_graphs import DecodeGraphs, graph_batch_sizes
    from sluice_runtime.executor.model_runner import BatchItem, ModelRunner, StepInputs
    from sluice_runtime.executor.sampler import SampleRequest
    from sluice_runtime.sampling_params import SamplingParams

    runner = ModelRunner(tiny_model_dir, EngineConfig(attention_backend="triton", block_size=4, num_kv_blocks=64,
                                                      max_num_seqs=4, max_model_len=128))
    greedy = SamplingParams(temperature=0)
    prompts = [p[:n] for p, n in zip(_prompts(1), (9, 14, 3))]
    tables = [list(range(i * 8, i * 8 + 8)) for i in range(3)]
    firsts = runner.execute([], [BatchItem(p, 0, t, SampleRequest(greedy, p, [], None, [], None))
                                 for p, t in zip(prompts, tables)])
    step = StepInputs([r.token_id for r in firsts], [len(p) for p in prompts],
                      [SequenceSpan(i, 1, len(p) + 1, t) for i, (p, t) in enumerate(zip(prompts, tables))], [], [0, 1, 2])
    eager = runner._forward(step).clone()
    caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]

    def forward(input_ids, positions, meta):
        return runner.model.hidden_states(input_ids, positions, runner.backend, meta, runner.kv_caches)

    with torch.inference_mode():
        runner.graphs = DecodeGraphs(forward, graph_batch_sizes(4), 128, 4, None, runner.cfg.hidden_size,
                                     runner.dtype, CPU, capture=lambda step: step)
        assert runner.graphs.sizes == [1, 2, 4]
        padded = runner._forward(step)
    assert padded.shape == eager.shape
    torch.testing.assert_close(padded, eager, atol=1e-5, rtol=1e-5)
    # The padding row wrote nowhere: every slot but the real rows' holds exactly what it held. The
    # real rows rewrote theirs with what the eager step wrote, up to float32 rounding: a 4-row matmul
    # may sum in another order than a 3-row one (it does with AVX2 BLAS kernels).
    written = torch.tensor([t[n // 4] * 4 + n % 4 for t, n in zip(tables, (len(p) for p in prompts))])
    others = torch.ones(runner.kv_caches[0][0].shape[0], dtype=torch.bool)
    others[written] = False
    for (k, v), (k0, v0) in zip(runner.kv_caches, caches):
        assert torch.equal(k[others], k0[others]) and torch.equal(v[others], v0[others])
        torch.testing.assert_close(k[written], k0[written], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(v[written], v0[written], atol=1e-6, rtol=1e-5)
