"""The strong augmentation of MLKD (and FixMatch): RandAugment with two operations, then Cutout, in batches.

The official MLKD code (``mdistiller/dataset/cifar100.py``, ``RandAugment(2, 10)``) draws two of 14 PIL
operations with replacement, each with a magnitude uniform in its range, then a Cutout square of side
U(0, 0.5)·W at a uniform centre, filled with (125, 123, 114). Here every random number is drawn by the
loader from the epoch's plan (:func:`draw_rand_augment`), so a sample's strong view depends only on its
position in the plan: deterministic under the seed, identical on resume and under DDP. The operations act
on [0, 255] pixel values on the device; geometric ones sample the nearest pixel (fill 0) as PIL's
``transform``/``rotate`` do. Same operations and ranges as the official code; bit parity with PIL's
rounding is not claimed.
"""

from __future__ import annotations

import math

import torch

# (name, low, high): the official augment_list(), in its order
OPERATIONS = (
    ("auto_contrast", 0.0, 1.0), ("brightness", 0.05, 0.95), ("color", 0.05, 0.95),
    ("contrast", 0.05, 0.95), ("equalize", 0.0, 1.0), ("identity", 0.0, 1.0), ("posterize", 4.0, 8.0),
    ("rotate", -30.0, 30.0), ("sharpness", 0.05, 0.95), ("shear_x", -0.3, 0.3), ("shear_y", -0.3, 0.3),
    ("solarize", 0.0, 256.0), ("translate_x", -0.3, 0.3), ("translate_y", -0.3, 0.3),
)
NUM_OPS = 2  # RandAugment(n=2, m=10): m is unused by the official code
CUTOUT_MAX = 0.5  # side as a fraction of the width
CUTOUT_FILL = (125.0, 123.0, 114.0)


def draw_rand_augment(g: torch.Generator, shape: tuple[int, ...], device) -> dict[str, torch.Tensor]:
    """The random numbers of ``shape`` strong augmentations: ``ops`` (*shape, 2) operation indices,
    ``levels`` (*shape, 2) uniform [0, 1) magnitudes, ``cutout`` (*shape, 3) side fraction in [0, 1)
    (times 0.5) and centre (x, y) in [0, 1)."""
    return {
        "ops": torch.randint(0, len(OPERATIONS), (*shape, NUM_OPS), generator=g, device=device),
        "levels": torch.rand((*shape, NUM_OPS), generator=g, device=device),
        "cutout": torch.rand((*shape, 3), generator=g, device=device),
    }


def rand_augment_batch(x: torch.Tensor, ops: torch.Tensor, levels: torch.Tensor, cutout: torch.Tensor,
                       full_scale: float = 255.0) -> torch.Tensor:
    """RandAugment(2) + Cutout of images ``x`` (B, C, H, W) with values in [0, full_scale], any dtype;
    ``ops``, ``levels`` (B, 2), ``cutout`` (B, 3) from :func:`draw_rand_augment`. Returns ``x``'s dtype."""
    u = x.float() * (255.0 / full_scale)
    for step in range(ops.shape[1]):
        u = _apply(u, ops[:, step], levels[:, step])
    u = _cutout(u, cutout)
    if x.dtype == torch.uint8:
        return u.round().clamp(0, 255).to(torch.uint8)
    return (u * (full_scale / 255.0)).to(x.dtype)


def _apply(u: torch.Tensor, op: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    """Operation ``op[b]`` at magnitude low + (high − low)·level[b] on each image."""
    out = u.clone()
    for index, (name, low, high) in enumerate(OPERATIONS):
        chosen = (op == index).nonzero().flatten()
        if len(chosen) == 0 or name == "identity":
            continue
        value = (low + (high - low) * level[chosen]).view(-1, 1, 1, 1)
        out[chosen] = _OPS[name](u[chosen], value)
    return out


def _gray(u: torch.Tensor) -> torch.Tensor:
    """PIL's L conversion (ITU-R 601-2 luma) of RGB images, the image itself for one channel."""
    if u.shape[1] != 3:
        return u.mean(1, keepdim=True)
    weights = torch.tensor([19595.0, 38470.0, 7471.0], device=u.device).view(1, 3, 1, 1)  # PIL's L24 integers
    return torch.floor(((u * weights).sum(1, keepdim=True) + 32768) / 65536)


def _blend(degenerate: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PIL ImageEnhance: degenerate + v·(image − degenerate), clipped to [0, 255]."""
    return (degenerate + v * (u - degenerate)).clamp(0, 255).floor()


def _auto_contrast(u, v):
    lo, hi = u.amin((2, 3), keepdim=True), u.amax((2, 3), keepdim=True)
    scale = torch.where(hi > lo, 255.0 / (hi - lo).clamp_min(1e-6), torch.ones_like(hi))
    return torch.where(hi > lo, ((u - lo) * scale).floor(), u).clamp(0, 255)


def _equalize(u, v):
    """PIL ImageOps.equalize per channel: the cumulative histogram, excluding the top level's count,
    spread over 255 steps."""
    out = u.clone()
    levels = u.round().clamp(0, 255).long()
    for b in range(u.shape[0]):
        for c in range(u.shape[1]):
            hist = torch.bincount(levels[b, c].flatten(), minlength=256)
            nonzero = hist[hist > 0]
            step = (nonzero.sum() - nonzero[-1]) // 255
            if step == 0:
                continue
            lut = ((torch.cumsum(hist, 0) - hist + step // 2) // step).clamp(max=255)
            out[b, c] = lut[levels[b, c]].float()
    return out


def _posterize(u, v):
    bits = v.floor().clamp(1, 8)
    keep = 2.0 ** (8 - bits)
    return torch.floor(u.round().clamp(0, 255) / keep) * keep


def _sharpness(u, v):
    """PIL's SMOOTH filter (3×3, centre 5, others 1, /13) inside the image, the border unchanged."""
    kernel = torch.ones(3, 3, device=u.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13).expand(u.shape[1], 1, 3, 3)
    smooth = torch.nn.functional.conv2d(u, kernel, padding=1, groups=u.shape[1])
    degenerate = u.clone()
    degenerate[..., 1:-1, 1:-1] = smooth[..., 1:-1, 1:-1].round()
    return _blend(degenerate, u, v)


def _solarize(u, v):
    return torch.where(u >= v, 255.0 - u, u)


def _affine(u: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Output pixel (x, y) takes input pixel matrix·(x, y, 1) (PIL's inverse ``AFFINE`` convention, pixel
    centres), nearest neighbour, 0 outside. ``matrix``: (B, 2, 3)."""
    batch, channels, height, width = u.shape
    ys, xs = torch.meshgrid(torch.arange(height, device=u.device, dtype=u.dtype) + 0.5,
                            torch.arange(width, device=u.device, dtype=u.dtype) + 0.5, indexing="ij")
    grid = torch.stack([xs, ys, torch.ones_like(xs)], 0).view(1, 3, -1)
    source = (matrix.to(u.dtype) @ grid).floor().long()  # (B, 2, H·W)
    sx, sy = source[:, 0], source[:, 1]
    inside = (sx >= 0) & (sx < width) & (sy >= 0) & (sy < height)
    index = (sy.clamp(0, height - 1) * width + sx.clamp(0, width - 1)).unsqueeze(1).expand(-1, channels, -1)
    out = u.reshape(batch, channels, -1).gather(2, index) * inside.unsqueeze(1)
    return out.reshape(batch, channels, height, width)


def _matrix(rows: list[list[torch.Tensor | float]], like: torch.Tensor) -> torch.Tensor:
    n = like.shape[0]
    return torch.stack([torch.stack([torch.as_tensor(e, dtype=like.dtype, device=like.device).expand(n)
                                     for e in row], -1) for row in rows], 1)


def _rotate(u, v):
    """PIL ``rotate(v)``: counter-clockwise by v degrees about the centre."""
    angle = -v.flatten() * math.pi / 180  # the inverse map turns the other way
    height, width = u.shape[-2:]
    cx, cy = width / 2, height / 2
    cos, sin = torch.cos(angle), torch.sin(angle)
    return _affine(u, _matrix([[cos, sin, cx - cos * cx - sin * cy], [-sin, cos, cy + sin * cx - cos * cy]], v.flatten()))


def _shear_x(u, v):
    return _affine(u, _matrix([[1.0, v.flatten(), 0.0], [0.0, 1.0, 0.0]], v.flatten()))


def _shear_y(u, v):
    return _affine(u, _matrix([[1.0, 0.0, 0.0], [v.flatten(), 1.0, 0.0]], v.flatten()))


def _translate_x(u, v):
    return _affine(u, _matrix([[1.0, 0.0, v.flatten() * u.shape[-1]], [0.0, 1.0, 0.0]], v.flatten()))


def _translate_y(u, v):
    return _affine(u, _matrix([[1.0, 0.0, 0.0], [0.0, 1.0, v.flatten() * u.shape[-2]]], v.flatten()))


def _cutout(u: torch.Tensor, cutout: torch.Tensor) -> torch.Tensor:
    """The official Cutout: side s = U·0.5·W, corner (max(0, x0 − s/2), max(0, y0 − s/2)) of a centre
    (x0, y0) uniform in the image, filled with (125, 123, 114); PIL's rectangle includes both corners."""
    height, width = u.shape[-2:]
    side = cutout[:, 0] * CUTOUT_MAX * width
    x0 = (cutout[:, 1] * width - side / 2).clamp_min(0).floor()
    y0 = (cutout[:, 2] * height - side / 2).clamp_min(0).floor()
    x1, y1 = (x0 + side).clamp(max=width), (y0 + side).clamp(max=height)
    xs = torch.arange(width, device=u.device).view(1, 1, -1)
    ys = torch.arange(height, device=u.device).view(1, -1, 1)
    box = ((xs >= x0.view(-1, 1, 1)) & (xs <= x1.view(-1, 1, 1)) & (ys >= y0.view(-1, 1, 1))
           & (ys <= y1.view(-1, 1, 1)) & (side > 0).view(-1, 1, 1))
    fill = torch.tensor(CUTOUT_FILL[:u.shape[1]] if u.shape[1] <= 3 else CUTOUT_FILL[:1] * u.shape[1],
                        device=u.device).view(1, -1, 1, 1)
    return torch.where(box.unsqueeze(1), fill, u)


_OPS = {
    "auto_contrast": _auto_contrast,
    "brightness": lambda u, v: _blend(torch.zeros_like(u), u, v),
    "color": lambda u, v: _blend(_gray(u).expand_as(u), u, v),
    "contrast": lambda u, v: _blend(_gray(u).mean((2, 3), keepdim=True).round().expand_as(u), u, v),
    "equalize": _equalize,
    "posterize": _posterize,
    "rotate": _rotate,
    "sharpness": _sharpness,
    "shear_x": _shear_x,
    "shear_y": _shear_y,
    "solarize": _solarize,
    "translate_x": _translate_x,
    "translate_y": _translate_y,
}
