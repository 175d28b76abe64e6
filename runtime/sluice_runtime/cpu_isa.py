"""What this CPU computes natively, read once when the engine starts, and the CPU paths that follow.

Three levels decide the native kernels' build: avx512 (AVX-512 F/BW/VL/DQ), avx2 (AVX2 with FMA)
and generic (what the compiler vectorizes by itself; every non-x86 CPU). Separately, oneDNN
computes bfloat16 natively only with AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT, and bfloat16 matmuls
reach float32's speed only with AVX512-BF16 or AMX, which is what `--dtype auto` asks for.

SLUICE_CPU_ISA=avx2 or generic caps the level below what the CPU has, so those paths run, and are
tested, on any machine. It cannot raise the level: asking for instructions the CPU lacks is
refused with their names. Generic also keeps float32 linears on torch's plain path. Torch's own
kernels have their own caps (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2), which the AVX2
test run sets alongside.
"""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

ENV = "SLUICE_CPU_ISA"
LEVELS = ("generic", "avx2", "avx512")  # each includes the ones before it
_NEEDS = {"avx2": "AVX2 and FMA", "avx512": "AVX-512 (F, BW, VL and DQ)"}
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
# Per level on x86: -march=native tunes for this CPU, the -mno- flags take away what is above the level
# (each also removes every extension that builds on it).
_X86_FLAGS = {"avx512": [], "avx2": ["-mno-avx512f"], "generic": ["-mno-avx"]}


class CpuIsaError(ValueError):
    """SLUICE_CPU_ISA names an unknown level or one this CPU cannot run."""


@dataclass(frozen=True)
class CpuFeatures:
    """What this CPU offers, as torch reads it: instruction sets torch's kernels dispatch on."""

    avx2: bool
    avx512: bool
    avx512_bf16: bool
    amx: bool
    # oneDNN's own tests: bfloat16 (float16) matmuls without emulation; bfloat16 weights it can pre-pack.
    onednn_bf16: bool
    onednn_fp16: bool
    x86: bool


@dataclass(frozen=True)
class CpuPaths:
    """The CPU paths the engine takes: chosen once from CpuFeatures and SLUICE_CPU_ISA."""

    level: str
    detected: str
    # Half-precision matmuls oneDNN computes natively (bfloat16 weights are then pre-packed for it);
    # elsewhere those linears compute in float32 (executor/packed_linear.py).
    onednn_bf16: bool
    onednn_fp16: bool
    # bfloat16 matmuls at least as fast as float32: `--dtype auto` picks bfloat16.
    fast_bf16: bool
    # Float32 weights pre-packed for oneDNN (x86 above generic): torch's plain float32 linear leaves
    # small-row matmuls to MKL, which is slower there (executor/packed_linear.py).
    onednn_fp32: bool
    compile_flags: tuple[str, ...]

    @property
    def forced(self) -> bool:
        return self.level != self.detected

    def describe(self) -> str:
        how = f"{ENV}={self.level}, detected {self.detected}" if self.forced else "detected"
        return f"{self.level} ({how})"


def detected_level(features: CpuFeatures) -> str:
    if features.avx512:
        return "avx512"
    return "avx2" if features.avx2 else "generic"


def choose(features: CpuFeatures, requested: str | None) -> CpuPaths:
    """The paths for `features`, capped at `requested` (the value of SLUICE_CPU_ISA, None or '' for none)."""
    detected = detected_level(features)
    level = detected
    if requested is not None and requested.strip():
        level = requested.strip().lower()
        if level not in LEVELS:
            raise CpuIsaError(f"{ENV}={requested!r} is not a CPU level; use one of {', '.join(LEVELS)} "
                              "(or leave it unset to use what the CPU has)")
        if LEVELS.index(level) > LEVELS.index(detected):
            raise CpuIsaError(f"{ENV}={level} needs {_NEEDS[level]}, which this CPU lacks "
                              f"(it runs the {detected} paths)")
    native_level = level == "avx512"
    flags = ["-march=native", *(_X86_FLAGS[level] if features.x86 else [])]
    return CpuPaths(level=level, detected=detected, onednn_bf16=features.onednn_bf16 and native_level,
                    onednn_fp16=features.onednn_fp16 and native_level,
                    fast_bf16=native_level and (features.avx512_bf16 or features.amx),
                    onednn_fp32=features.x86 and level != "generic", compile_flags=tuple(flags))


def read_features() -> CpuFeatures:
    import torch

    def check(name: str) -> bool:
        probe = getattr(torch.cpu, name, None)
        return bool(probe()) if probe is not None else False

    def onednn(name: str) -> bool:
        probe = getattr(torch.ops.mkldnn, name, None) if torch.backends.mkldnn.is_available() else None
        return bool(probe()) if probe is not None else False

    return CpuFeatures(
        avx2=check("_is_avx2_supported"), avx512=check("_is_avx512_supported"),
        avx512_bf16=check("_is_avx512_bf16_supported"), amx=check("_is_amx_tile_supported"),
        onednn_bf16=onednn("_is_mkldnn_bf16_supported"), onednn_fp16=onednn("_is_mkldnn_fp16_supported"),
        x86=platform.machine().lower() in _X86)


@functools.cache
def cpu_paths() -> CpuPaths:
    """This process's CPU paths: read on first use (the engine's start), then fixed."""
    return choose(read_features(), os.environ.get(ENV))
