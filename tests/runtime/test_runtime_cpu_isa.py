"""CPU paths follow what the CPU computes natively; SLUICE_CPU_ISA runs the lower levels' paths on any machine.

The last tests run the CPU kernel and layer tests again in fresh processes with the AVX2 and the
generic level forced (the level is read once per process), so those paths stay tested on
AVX-512 machines too.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice_runtime.cpu_isa import CpuFeatures, CpuIsaError, choose, cpu_paths, read_features

AVX2_EPYC = CpuFeatures(avx2=True, avx512=False, avx512_bf16=False, amx=False, onednn_bf16=False,
                        onednn_fp16=False, x86=True)
SKYLAKE = CpuFeatures(avx2=True, avx512=True, avx512_bf16=False, amx=False, onednn_bf16=True, onednn_fp16=False,
                      x86=True)
SAPPHIRE_RAPIDS = CpuFeatures(avx2=True, avx512=True, avx512_bf16=True, amx=True, onednn_bf16=True,
                              onednn_fp16=True, x86=True)
GRAVITON = CpuFeatures(avx2=False, avx512=False, avx512_bf16=False, amx=False, onednn_bf16=False,
                       onednn_fp16=False, x86=False)


def test_each_cpu_gets_its_own_level_and_bfloat16_paths():
    avx2 = choose(AVX2_EPYC, None)
    assert (avx2.level, avx2.onednn_bf16, avx2.fast_bf16, avx2.forced) == ("avx2", False, False, False)
    assert avx2.compile_flags == ("-march=native", "-mno-avx512f")
    skylake = choose(SKYLAKE, None)
    # oneDNN packs bfloat16 there, but the matmuls are not faster than float32: auto stays float32.
    assert (skylake.level, skylake.onednn_bf16, skylake.fast_bf16) == ("avx512", True, False)
    assert skylake.compile_flags == ("-march=native",)
    assert choose(SAPPHIRE_RAPIDS, "").fast_bf16 and choose(SAPPHIRE_RAPIDS, None).onednn_fp16
    graviton = choose(GRAVITON, None)
    assert (graviton.level, graviton.compile_flags) == ("generic", ("-march=native",))
    # Float32 weights are packed for oneDNN on x86 above generic; forcing generic keeps torch's plain path.
    assert avx2.onednn_fp32 and skylake.onednn_fp32 and not graviton.onednn_fp32
    assert not choose(AVX2_EPYC, "generic").onednn_fp32 and choose(SAPPHIRE_RAPIDS, "avx2").onednn_fp32


@pytest.mark.parametrize("requested", ["avx2", " AVX2 ", "Avx2\n"])
def test_forcing_avx2_turns_off_every_avx512_path(requested):
    paths = choose(SAPPHIRE_RAPIDS, requested)
    assert (paths.level, paths.detected, paths.forced) == ("avx2", "avx512", True)
    assert not paths.onednn_bf16 and not paths.onednn_fp16 and not paths.fast_bf16
    assert paths.compile_flags == ("-march=native", "-mno-avx512f")
    assert paths.describe() == "avx2 (SLUICE_CPU_ISA=avx2, detected avx512)"


def test_forcing_generic_builds_without_avx():
    assert choose(AVX2_EPYC, "generic").compile_flags == ("-march=native", "-mno-avx")
    assert choose(GRAVITON, "generic").compile_flags == ("-march=native",)


@pytest.mark.parametrize("features,requested,missing", [
    (AVX2_EPYC, "avx512", "AVX-512 (F, BW, VL and DQ)"),
    (GRAVITON, "avx2", "AVX2 and FMA"),
    (GRAVITON, "avx512", "AVX-512"),
])
def test_a_level_above_the_cpu_is_refused_naming_the_missing_instructions(features, requested, missing):
    with pytest.raises(CpuIsaError, match="which this CPU lacks") as error:
        choose(features, requested)
    assert missing in str(error.value)


@pytest.mark.parametrize("requested", ["avx-512", "native", "sse4", "avx2,generic", "1", "avx2 generic"])
def test_an_unknown_level_is_refused_listing_the_levels(requested):
    with pytest.raises(CpuIsaError, match="use one of generic, avx2, avx512"):
        choose(SAPPHIRE_RAPIDS, requested)


def test_the_engine_refuses_to_start_on_a_level_it_cannot_run(monkeypatch):
    from sluice_runtime.engine.llm import LLM
    from sluice_runtime.model_load_error import ModelLoadError

    above = {"generic": "avx2", "avx2": "avx512"}.get(cpu_paths().detected, "sse")
    monkeypatch.setenv("SLUICE_CPU_ISA", above)
    cpu_paths.cache_clear()
    try:
        with pytest.raises(ModelLoadError, match=f"SLUICE_CPU_ISA.*{above}"):
            LLM("smollm2", num_kv_blocks=16)
    finally:
        monkeypatch.undo()
        cpu_paths.cache_clear()


def test_the_decode_kernel_built_is_the_one_the_level_names():
    from sluice_runtime.executor.attention import native_cpu

    if native_cpu.load_library() is None:
        pytest.skip("no C++ compiler: the native kernel could not be built")
    expected = {"avx512": "three-pass AVX-512", "avx2": "three-pass AVX2", "generic": "generic"}[cpu_paths().level]
    assert native_cpu.kernel_name().startswith(expected)


# Everything that takes a CPU-level path: kernels, fused layers, linears (int8 too), a bfloat16 model end to end.
FORCED_CHECKS = ["tests/runtime/test_runtime_cpu_isa.py::test_the_decode_kernel_built_is_the_one_the_level_names",
                 "tests/runtime/test_runtime_native_attention.py", "tests/runtime/test_runtime_fused_cpu.py",
                 "tests/runtime/test_runtime_packed_linear.py", "tests/runtime/test_runtime_quantization.py",
                 "tests/runtime/test_runtime_greedy_parity.py::test_bfloat16_runs_and_agrees_on_an_easy_answer"]


@pytest.mark.parametrize("level", ["avx2", "generic"])
def test_cpu_paths_pass_with_the_level_forced(level):
    if level == "avx2" and not read_features().avx2:
        pytest.skip("this CPU has no AVX2")
    root = Path(__file__).parents[2]
    # Torch's own kernels capped alike, so bfloat16 matmuls take the emulated path an AVX2 CPU has.
    env = {**os.environ, "SLUICE_CPU_ISA": level, "ATEN_CPU_CAPABILITY": "avx2" if level == "avx2" else "default",
           "ONEDNN_MAX_CPU_ISA": "AVX2" if level == "avx2" else "SSE41"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *FORCED_CHECKS],
                            cwd=root, env=env, capture_output=True, text=True, timeout=900)
    report = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert " passed" in result.stdout and " failed" not in result.stdout, report
