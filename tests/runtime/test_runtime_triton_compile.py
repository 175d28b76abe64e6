"""The Triton kernels compile ahead of time for an H100/H200 (sm_90) without a GPU.

The interpreter (test_runtime_triton_attention.py) checks what they compute but not that the
compiler accepts them; this compiles the bfloat16 serving variants down to a cubin.
"""
import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sluice_runtime.executor.attention import triton_kernels as kernels  # noqa: E402

STRIDES = ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_cs", "stride_ch", "stride_bt")


def _compile(fn, pointers: dict, scalars: dict, constexprs: dict):
    signature = pointers | scalars | {name: "constexpr" for name in constexprs}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"]


def test_store_and_split_merge_kernels_compile():
    _compile(kernels._store_kv_kernel, {n: "*bf16" for n in ("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr")} | {"slot_ptr": "*i64"},
             {n: "i32" for n in ("stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_cs", "stride_ch")},
             {"NUM_HEADS": 8, "HEAD_DIM": 64, "BLOCK_H": 8, "BLOCK_D": 64})
    _compile(kernels._reduce_splits_kernel, {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": "*bf16"},
             {n: "i32" for n in ("num_splits", "stride_pt", "stride_ph", "stride_ps", "stride_lt", "stride_lh",
                                 "stride_ot", "stride_oh")},
             {"HEAD_DIM": 64, "BLOCK_S": 16, "BLOCK_D": 64})


def test_split_kv_decode_kernel_compiles():
    _compile(kernels._decode_kernel,
             {n: "*bf16" for n in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
             | {"block_tables_ptr": "*i32", "context_lens_ptr": "*i32", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"},
             {"qk_scale": "fp32", "window": "i32"}
             | {n: "i32" for n in STRIDES + ("stride_pt", "stride_ph", "stride_ps", "stride_lt", "stride_lh", "num_splits")},
             {"GROUP": 4, "HEAD_DIM": 64, "BLOCK_SIZE": 16, "BLOCK_G": 16, "BLOCK_D": 64, "BLOCK_N": 64,
              "USE_WINDOW": True, "SPLIT": True, "PRECISION": "tf32"})


def test_prefill_kernel_compiles():
    _compile(kernels._prefill_kernel,
             {n: "*bf16" for n in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
             | {n: "*i32" for n in ("block_tables_ptr", "query_starts_ptr", "query_lens_ptr", "context_lens_ptr")},
             {"qk_scale": "fp32", "window": "i32"} | {n: "i32" for n in STRIDES},
             {"GROUP": 4, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_D": 128,
              "USE_WINDOW": True, "PRECISION": "tf32"})
