"""Rounding facts the certificates rest on: the error bound of an inner product in float32 or bfloat16 with float32
accumulation (Higham, Accuracy and Stability, eq. 3.5), whether float32 products are IEEE float32 here (not TF32
or bfloat16 inner products), and whether bfloat16 products are native (oneDNN or CUDA, float32 sums)."""

from __future__ import annotations

import torch


def _gamma(n: int, u: float) -> float:
    """gamma_n = n u / (1 - n u), the relative error bound of an n-term inner product with unit roundoff u."""
    return n * u / (1 - n * u)


def _product_error(dtype: torch.dtype, d: int) -> float:
    """c such that |computed <w_j, h> - <w_j, h>| <= c ||h|| + d 2^-120 for the product of a direction h,
    exactly representable in ``dtype``, with the unit rows in ``dtype`` (from the float32 unit rows W32),
    float32 accumulation.

    float32 (u = 2^-24): ||W32_j - w_j|| <= u plus the d-term inner product's gamma_d; gamma_{d+4} covers both
    (as before: Higham, Accuracy and Stability, eq. 3.5). bfloat16 (v = 2^-8): the rows' second rounding adds
    v (1 + u), the float32 accumulation gamma_{d+4} (1 + v)(1 + u), and the result's rounding to bfloat16 at
    most 2 v of its size (taken twice a round-to-nearest's half unit, for any rounding mode). The absolute
    term covers subnormals flushed to zero.
    """
    u = 2.0**-24
    if dtype == torch.float32:
        return _gamma(d + 4, u)
    v = 2.0**-8
    accumulated = (1 + v) * (1 + u) * (1 + _gamma(d + 4, u))
    return v * (1 + u) + u + (1 + v) * (1 + u) * _gamma(d + 4, u) + 2 * v * accumulated


def _ieee_float32_matmul(device: torch.device) -> bool:
    """Whether float32 matrix products on ``device`` are computed in float32 arithmetic: not with TF32 or
    bfloat16 inner products (``torch.set_float32_matmul_precision`` "high"/"medium", the backends'
    ``fp32_precision``, cuBLAS's ``allow_tf32``), which the float32 screening bound of ``_screen_bounds``
    assumes. Devices other than CPU and CUDA answer False (the float64 scores are used there)."""
    if device.type not in ("cpu", "cuda"):
        return False
    backend = torch.backends.mkldnn if device.type == "cpu" else torch.backends.cuda
    matmul = getattr(backend, "matmul", None)
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9: per-backend settings ("none" inherits the parent's)
        settings = (torch.backends.fp32_precision, getattr(backend, "fp32_precision", "none"), matmul.fp32_precision)
        return all(setting in ("none", "ieee") for setting in settings)
    if torch.get_float32_matmul_precision() != "highest":
        return False
    return device.type == "cpu" or not torch.backends.cuda.matmul.allow_tf32


def _screen_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 for the screening's K x K products where they are native and accumulate in float32: on CPU
    where oneDNN has bfloat16 kernels (AVX-512 or AMX; an AVX2-only CPU emulates them far slower than float32),
    on CUDA where bfloat16 is supported and reduced-precision reductions are off
    (``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``, on by default, lets cuBLAS sum in
    bfloat16, which the rounding bound of :func:`_product_error` does not cover); float32 otherwise."""
    if device.type == "cpu":
        native = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    elif device.type == "cuda":
        native = (torch.cuda.is_bf16_supported()
                  and not torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
    else:
        native = False
    return torch.bfloat16 if native else torch.float32
