"""--quantization int8: every linear layer's weight as int8 with one scale per output channel.

Two kernels, chosen once at start (`choose_kernel`):
- DYNAMIC, on x86 CPUs with AVX-512 VNNI: fbgemm's dynamic linear quantizes each call's activations
  to 8 bits (one scale per call) and multiplies int8 by int8 into int32, so a decode step's matmuls
  read a quarter of float32's bytes and run on the integer units. One scale per call is ruined by
  the few input channels of an LLM's activations that run far larger than the rest, so each layer
  is smoothed first (SmoothQuant): input channel j is divided by s_j and the weight's column j
  multiplied by it, s_j = peak|x_j|^ALPHA / peak|w_j|^(1-ALPHA), with the activation peaks recorded
  on one forward over CALIBRATION_TEXT at start. The MLP's down projection takes the gate's
  product, a few of whose channels peak beyond what smoothing brings within one scale per call:
  those (FLOAT_CHANNELS, the largest calibrated peaks) are left out of the int8 product and
  multiplied in float32 beside it. Without VNNI (AVX2, or SLUICE_CPU_ISA=avx2) fbgemm's
  multiply-add saturates at 16 bits unless activations keep 7 bits, and with 7 bits SmolLM2's
  perplexity leaves the quality test's bound, so those CPUs take the weight-only kernel.
- WEIGHT_ONLY, everywhere else (SLUICE_CPU_ISA=generic, other CPUs, CUDA): the int8 weight is widened
  to the activations' dtype inside the call and the scale applied to the output, so the weights'
  resident memory shrinks and activations keep the base dtype.

Embedding tables are int8 too (a looked-up row is widened and scaled); a tied embedding shares the
LM head's table on the WEIGHT_ONLY path. Norms, rotary tables and the KV cache stay in the base
dtype: they are small or not weights.
"""
from __future__ import annotations

import contextlib
import types
import warnings
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

DYNAMIC = "dynamic int8 activations x int8 weights (fbgemm, smoothed)"
WEIGHT_ONLY = "int8 weights widened per call (weight-only)"
# Of the searched 0.5-0.85, the exponent that kept the perplexity of the quality test closest to float32's.
ALPHA = 0.7
# Per linear (by its name's last part), how many input channels DYNAMIC computes in float32: with none, SmolLM2's
# perplexity leaves the quality test's bound; on the other linears they buy nothing measurable.
FLOAT_CHANNELS = {"down_proj": 32}
# Prose, code, chat and numbers, so every kind of input's channel peaks are seen.
CALIBRATION_TEXT = (
    "Kubernetes schedules containers onto nodes. A pod holds one or more containers that share a network "
    "namespace. def add(a, b):\n    return a + b\n User: What is the weather like today? Assistant: I cannot "
    "see outside, but I can help you find a forecast. 1, 2, 3, 5, 8, 13, 21. Das ist ein Satz auf Deutsch. ") * 2


def choose_kernel(device: torch.device, cpu_level: str | None) -> str:
    """DYNAMIC where fbgemm keeps 8-bit activations (AVX-512 VNNI at the avx512 level), else WEIGHT_ONLY."""
    fbgemm = "fbgemm" in torch.backends.quantized.supported_engines
    vnni = cpu_level == "avx512" and torch.cpu._is_vnni_supported()
    return DYNAMIC if device.type == "cpu" and fbgemm and vnni else WEIGHT_ONLY


def calibration_ids(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir)).encode(CALIBRATION_TEXT)


@contextlib.contextmanager
def input_peaks(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Records, per linear (by name), the largest |input| of each input channel over the forwards run inside."""
    peaks: dict[str, torch.Tensor] = {}

    def hook(name: str, x: torch.Tensor) -> None:
        peak = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
        peaks[name] = torch.maximum(peaks[name], peak) if name in peaks else peak

    handles = [m.register_forward_pre_hook(lambda _, args, name=name: hook(name, args[0]))
               for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    try:
        yield peaks
    finally:
        for handle in handles:
            handle.remove()


def smoothing(peak_x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SmoothQuant's per-input-channel divisor of the activations (and factor of the weight's columns)."""
    peak_w = weight.detach().float().abs().amax(dim=0)
    floor = torch.finfo(torch.float32).eps
    return (peak_x.clamp(min=floor) ** ALPHA / peak_w.clamp(min=floor) ** (1 - ALPHA)).clamp(min=floor)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: (int8 weight, float32 scale per row), weight ~= int8 * scale[:, None]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


def _dynamic_pack(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    # fbgemm takes its weight as a quantized tensor only; torch flags those tensors' constructors as
    # deprecated, and the lock pins a torch that has them.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0)
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        return torch.ops.quantized.linear_prepack(qweight, None if bias is None else bias.detach().float())
    finally:
        torch.backends.quantized.engine = engine


def _dynamic_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    wide = x.float()
    out = torch.ops.quantized.linear_dynamic(wide * self.int8_unsmooth, self.int8_packed, False)
    if self.int8_float_channels.numel():
        out = out + wide.index_select(-1, self.int8_float_channels) @ self.int8_float_weight
    return out.to(x.dtype)


def _weight_only_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    out = F.linear(x, self.int8_weight.to(x.dtype)) * self.int8_scale.to(x.dtype)
    return out if self.bias is None else out + self.bias


def _embedding_forward(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, self.int8_weight).to(self.weight.dtype) * self.int8_scale[ids, None].to(self.weight.dtype)


def _shape_only(weight: torch.Tensor) -> nn.Parameter:
    """Keeps the weight's shape, dtype and device (what the rest of the engine reads) in no memory."""
    return nn.Parameter(torch.zeros((), dtype=weight.dtype, device=weight.device).expand(weight.shape),
                        requires_grad=False)


def quantize_model(model: nn.Module, kernel: str, peaks: dict[str, torch.Tensor] | None = None) -> int:
    """Replaces every linear's weight and every embedding table with int8 and scales, the linears
    computing through `kernel` (DYNAMIC needs `peaks` from input_peaks). Returns the bytes the int8
    copies take, fbgemm's packed ones included."""
    tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # one int8 copy per shared weight, unsmoothed

    def table(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if id(weight) not in tables:
            tables[id(weight)] = quantize_rows(weight)
        return tables[id(weight)]

    packed = 0
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            module.int8_weight, module.int8_scale = table(module.weight)
            module.forward = types.MethodType(_embedding_forward, module)
        elif isinstance(module, nn.Linear) and kernel == DYNAMIC:
            weight = module.weight.detach().float()
            smooth = smoothing(peaks[name], weight)
            floats = peaks[name].topk(FLOAT_CHANNELS.get(name.rsplit(".", 1)[-1], 0)).indices
            module.int8_float_channels, module.int8_float_weight = floats, weight[:, floats].t().contiguous()
            unsmooth, smoothed = 1 / smooth, weight * smooth
            unsmooth[floats], smoothed[:, floats] = 0, 0  # the float32 product's share, outside the int8 one
            q, scale = quantize_rows(smoothed)
            module.int8_packed = _dynamic_pack(q, scale, module.bias)
            module.int8_unsmooth = unsmooth
            module.forward = types.MethodType(_dynamic_forward, module)
            packed += (q.numel() + (scale.numel() + smooth.numel()) * scale.element_size()
                       + module.int8_float_weight.numel() * module.int8_float_weight.element_size())
        elif isinstance(module, nn.Linear):
            module.int8_weight, module.int8_scale = table(module.weight)
            module.forward = types.MethodType(_weight_only_forward, module)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight = _shape_only(module.weight)
    return packed + sum(q.numel() + s.numel() * s.element_size() for q, s in tables.values())
