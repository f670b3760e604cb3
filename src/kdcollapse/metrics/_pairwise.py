r"""Class-pairwise collapse metrics without a K x K matrix in memory (vocabulary-scale K).

Two ways to avoid the K x K matrix, chosen per metric:

- **Gram identities** (O(K d^2) time, O(d^2) memory) where the metric is a Frobenius norm of a K x K matrix
  built from class vectors: ``||A B^T||_F^2 = <A^T A, B^T B>`` turns it into d x d products. The simplex-ETF
  errors of NC2 and NC3 (Kothapalli 2023, as rhubarbwu/neural-collapse computes them) are of this kind.
- **Tiles** (O(K^2 d) time, O(tile^2) memory) where an entry-wise non-linearity (|.|, a quotient) forbids
  that: NC2's equiangularity (mean |cos + 1/(K-1)|) and CDNV, of the class means from one pass over their Gram
  tiles (``equiangle_and_cdnv``). Only the upper triangle of tiles is visited
  (both kernels are symmetric), a diagonal tile halved down to ``LEAF``-row blocks (``_triangle``), each tile
  is a ``tile x tile`` block in the dtype of the inputs (float64 in ``collapse_metrics``), and tile sums are
  accumulated in float64.

With ``tile = TILE`` = 2048 a float64 tile is 32 MiB; ``class_mean_kernels`` keeps six tile-sized buffers
(``_Workspace``, about 200 MiB) and reuses them for every block, whatever K.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics._linalg import LazyRows, Rows, cross_gram, row_dots, row_sum

TILE = 2048  # rows and columns of one pairwise tile


def _check_tile(tile: int) -> int:
    if not isinstance(tile, int) or tile < 1:
        raise KdcollapseError(f"tile must be a positive integer, got {tile!r}")
    return tile


def _upper_tiles(num_rows: int, tile: int) -> Iterator[tuple[slice, slice, bool]]:
    """(rows, columns, on_diagonal) of every tile on or above the block diagonal."""
    starts = range(0, num_rows, _check_tile(tile))
    for i in starts:
        for j in starts:
            if j >= i:
                yield slice(i, i + tile), slice(j, j + tile), i == j


class _Moments:
    """Count, mean and sum of squared deviations of a stream of blocks, merged block by block (Chan et al.'s
    pairwise update), float64: the variance over K^2/2 pairs without a cancelling sum of squares. Each block's
    own moments are two-pass (its mean, then the squares about it, in place: ``add`` overwrites the block), exact
    to rounding and cheaper than ``torch.var_mean``'s running update."""

    def __init__(self) -> None:
        self.count, self.mean, self.squares = 0, None, None

    def add(self, block: Tensor) -> None:
        values = block.to(torch.float64).reshape(-1)  # overwritten below (the caller's block is spent)
        count = values.numel()
        if count == 0:
            return
        mean = values.sum() / count
        squares = values.sub_(mean).square_().sum()  # torch's cascaded sum: a BLAS dot's running sum loses
        # about n * eps of a sum dominated by a few entries (Riesz's heavy tail: 1e-11 at 2048^2 entries)
        if self.mean is None:
            self.count, self.mean, self.squares = count, mean, squares
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean = self.mean + delta * (count / total)
        self.squares = self.squares + squares + delta.square() * (self.count * count / total)
        self.count = total

    def variance(self) -> Tensor:
        """The mean over pairs of (kernel - its mean)^2 (no Bessel correction, as rhubarbwu's kernel_stats)."""
        return self.squares / self.count


class _Workspace:
    """Flat buffers reused from block to block, viewed as each block's shape. A fresh tile-sized tensor (32 MiB
    at ``TILE`` in float64, above the allocator's mmap threshold) is mapped anew and page-faulted on first
    touch, which costs more than the element-wise work on it; the buffers are allocated once, at the size of
    the first (largest) block."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device, self.flat = dtype, device, {}

    def __call__(self, name: str, rows: int, cols: int) -> Tensor:
        flat = self.flat.get(name)
        if flat is None or flat.numel() < rows * cols:
            flat = self.flat[name] = torch.empty(rows * cols, dtype=self.dtype, device=self.device)
        return flat[: rows * cols].view(rows, cols)


LEAF = 256  # a diagonal tile is halved down to blocks of at most this many rows (see _triangle)


def _triangle(num: int, leaf: int) -> Iterator[tuple[slice, slice, bool]]:
    """(rows, columns, on_diagonal) of blocks that cover the pairs i < j of a ``num x num`` diagonal tile once:
    the tile is halved until a diagonal block has at most ``leaf`` rows, so the kernel runs on about
    num^2 / 2 + num * leaf / 2 entries instead of num^2 (only the leaves' lower halves are wasted)."""
    if num <= leaf:
        yield slice(0, num), slice(0, num), True
        return
    half = num // 2
    yield from _triangle(half, leaf)
    yield slice(0, half), slice(half, num), False
    for rows, cols, diagonal in _triangle(num - half, leaf):
        yield slice(rows.start + half, rows.stop + half), slice(cols.start + half, cols.stop + half), diagonal


def _pair_blocks(rows: Rows, kernel: Callable[[Tensor, Tensor], Tensor | tuple[Tensor, ...]],
                 tile: int) -> Iterator[tuple[tuple[Tensor, ...], Tensor | None]]:
    """Every block of ``kernel`` over the unordered pairs of ``rows``, as (blocks, mask): ``mask`` None where
    every entry is a pair k < k', else the boolean upper triangle (above the diagonal) of a diagonal leaf."""
    held, a, masks = None, None, {}
    for r, c, diagonal in _upper_tiles(rows.shape[0], tile):
        if r != held:
            held, a = r, rows[r]
        parts = _triangle(len(a), LEAF) if diagonal else ((slice(None), slice(None), False),)
        other = a if diagonal else rows[c]
        for p, q, on_diagonal in parts:
            blocks = kernel(a[p], other[q])
            blocks = blocks if isinstance(blocks, tuple) else (blocks,)
            mask = None
            if on_diagonal:
                shape = blocks[0].shape
                mask = masks.get(shape)
                if mask is None:
                    mask = masks[shape] = torch.ones(shape, dtype=torch.bool, device=blocks[0].device).triu_(1)
            yield blocks, mask


def pair_moments(rows: Rows, kernel: Callable[[Tensor, Tensor], tuple[Tensor, ...]], moments: tuple[bool, ...],
                 tile: int = TILE) -> tuple[Tensor | tuple[Tensor, Tensor], ...]:
    """Like :func:`pair_mean` for a ``kernel`` returning a tuple of blocks, with ``moments[i]`` saying whether
    block i's entry is ``(mean, variance)`` over the pairs (variance about the mean, divided by the number of
    pairs; merged block by block, ``_Moments``) instead of its mean alone. The blocks with moments are
    overwritten (a kernel may return the same buffers on every call: each block is spent before the next)."""
    num = rows.shape[0]
    totals, stats = [None] * len(moments), [_Moments() if m else None for m in moments]
    for blocks, mask in _pair_blocks(rows, kernel, tile):
        for i, (block, stat) in enumerate(zip(blocks, stats)):
            if stat is not None:  # a block with moments: its mean comes from _Moments
                stat.add(block if mask is None else block[mask])
                continue
            part = (block if mask is None else block.triu(1)).sum(dtype=torch.float64)
            totals[i] = part if totals[i] is None else totals[i] + part
    pairs = num * (num - 1) / 2
    return tuple(total / pairs if stat is None else (stat.mean, stat.variance())
                 for total, stat in zip(totals, stats))


def pair_mean(rows: Rows, kernel: Callable[[Tensor, Tensor], Tensor | tuple[Tensor, ...]],
              tile: int = TILE) -> Tensor | tuple[Tensor, ...]:
    """Mean of ``kernel(a, b)`` over all unordered pairs k < k' of ``rows`` (K, ...), in tiles.

    ``kernel(a, b)`` takes two tiles of rows and returns their ``(len(a), len(b))`` block, or a tuple of such
    blocks (then a tuple of means: several kernels from one pass); it must be symmetric (block (a, b) is the
    transpose of block (b, a)). Float64 sums, no K x K matrix. ``rows`` may be ``LazyRows``: each tile's rows
    are then formed when it is visited (the row tile of a tile row once), so no K x d copy of them exists.
    """
    num = rows.shape[0]
    totals = None
    for blocks, mask in _pair_blocks(rows, kernel, tile):
        sums = [(block if mask is None else block.triu(1)).sum(dtype=torch.float64) for block in blocks]
        totals = sums if totals is None else [total + part for total, part in zip(totals, sums)]
    means = tuple(total / (num * (num - 1) / 2) for total in totals)
    return means if len(means) > 1 else means[0]


def equiangle(vectors: Rows, tile: int = TILE) -> Tensor:
    """NC2 equiangularity (Papyan et al. 2020): mean over k != k' of |cos(v_k, v_k') + 1/(K-1)|."""
    shift = 1 / (vectors.shape[0] - 1)
    unit = LazyRows.of(vectors).map(lambda rows: F.normalize(rows, dim=1))
    return pair_mean(unit, lambda a, b: (a @ b.mT).add_(shift).abs_(), tile)


def cdnv(class_means: Rows, variances: Tensor, tile: int = TILE) -> Tensor:
    r"""Class-distance normalised variance (Galanti et al. 2022), the mean over k < k' of
    :math:`(\sigma_k^2 + \sigma_{k'}^2) / (2\lVert\mu_k - \mu_{k'}\rVert^2)`, with
    :math:`\sigma_k^2 = \frac1{n_k}\sum_{i: y_i = k}\lVert h_i - \mu_k\rVert^2`.

    Distances come from ``|a|^2 + |b|^2 - 2 a.b`` about the mean of the class means (float64: the relative
    error is about eps * |mu_k - mu_bar|^2 / |mu_k - mu_k'|^2). Two equal class means give inf.
    """
    means = LazyRows.of(class_means)
    centre = (row_sum(means) / means.shape[0]).to(means.dtype)
    return equiangle_and_cdnv(means.map(lambda rows: rows - centre), variances, tile)[1]


def equiangle_and_cdnv(centred: Rows, variances: Tensor, tile: int = TILE) -> tuple[Tensor, Tensor]:
    """NC2's equiangularity (:func:`equiangle`) and CDNV (:func:`cdnv`) of the class means from one tiled pass:
    ``centred`` holds the class means less the mean of the class means (``class_centred``), ``variances`` the
    sigma_k^2. Both kernels read the same Gram tile C_a C_b^T: cosines are it over the rows' norms, squared
    distances |c_a|^2 + |c_b|^2 - 2 c_a.c_b, so the O(K^2 d) products run once instead of twice. A row of norm
    0 has cosine 0 with every row (as ``F.normalize`` gives)."""
    rows = LazyRows.of(centred)
    (num, dim), shift = rows.shape, 1 / (rows.shape[0] - 1)

    def bundled(part: slice) -> Tensor:  # [c_k, |c_k|^2, sigma_k^2, 0...]: 16 more columns keep the rows aligned
        chunk = rows[part]
        out = chunk.new_zeros(len(chunk), dim + 16)
        out[:, :dim], out[:, dim], out[:, dim + 1] = chunk, chunk.square().sum(1), variances[part]
        return out

    def kernel(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:  # in place where it can: fewer passes over a tile
        gram = a[:, :dim] @ b[:, :dim].mT
        inverse_a, inverse_b = (rows[:, dim].sqrt().clamp_min(1e-12).reciprocal() for rows in (a, b))
        squared = torch.add(a[:, dim, None], b[None, :, dim]).add_(gram, alpha=-2).clamp_min_(0).mul_(2)
        quotient = torch.add(a[:, dim + 1, None], b[None, :, dim + 1]).div_(squared)
        return gram.mul_(inverse_a[:, None]).mul_(inverse_b[None, :]).add_(shift).abs_(), quotient

    return pair_mean(LazyRows((num, dim + 16), rows.dtype, rows.device, bundled), kernel, tile)


# Hyperspherical uniformity (Liu et al. 2023, "Generalizing and decoupling neural collapse via hyperspherical
# uniformity gap"; "GNC2" of Wu & Papyan's Linguistic Collapse, NeurIPS 2024): kernels of the distance between
# the unit vectors of the centred class means, as rhubarbwu/neural-collapse's kernels.py defines them.
KERNELS = ("dist", "log", "riesz")


def hyperspherical_kernels(squared: Tensor, riesz_s: float, log_out: Tensor | None = None,
                           riesz_out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(|a - b|, log(1 / |a - b|), sign(s) |a - b|^(-s)) from a block of squared distances |a - b|^2 between unit
    vectors (rhubarbwu's ``dist_kernel``, ``log_kernel`` with exponent -1 and ``riesz_kernel``, whose s is
    d - 2). One log serves both: log(1 / |a - b|) = -log|a - b|^2 / 2 and |a - b|^(-s) = exp(-s log|a - b|^2 / 2)
    (an exp instead of ``pow``'s log and exp; its relative error is about s * eps). ``squared`` is overwritten
    (it becomes the distances); ``log_out`` and ``riesz_out``: buffers of its shape for the other two."""
    log_kernel = torch.log(squared, out=log_out)
    if riesz_s == 0:  # |a - b|^0 = 1, also at distance 0 (where 0 * log 0 is nan)
        riesz = torch.ones_like(squared) if riesz_out is None else riesz_out.fill_(1)
    else:
        riesz = torch.mul(log_kernel, -riesz_s / 2, out=riesz_out).exp_()
        if riesz_s < 0:
            riesz.neg_()
    return squared.sqrt_(), log_kernel.mul_(-0.5), riesz


def class_mean_kernels(centred: Rows, variances: Tensor, tile: int = TILE,
                       riesz_s: float | None = None) -> dict[str, Tensor]:
    """NC2's equiangularity, CDNV and the hyperspherical uniformity of the class means from one tiled pass over
    the Gram tiles C_a C_b^T of ``centred`` (the class means less the mean of the class means).

    Besides :func:`equiangle_and_cdnv`'s two means, ``nc2g_<kernel>_mean`` and ``nc2g_<kernel>_var``: the mean and
    the variance over class pairs k < k' of each kernel of ``KERNELS`` (``hyperspherical_kernels``) on the unit
    vectors u_k = c_k / |c_k|, whose squared distance is ``2 - 2 cos`` (float64 after the Gram: its absolute
    error is about eps, so a distance is exact to about eps / |u_k - u_k'|^2 relative). ``riesz_s`` defaults to
    d - 2, as rhubarbwu's ``riesz_kernel``. Two equal directions give distance 0: log and Riesz are then inf.
    """
    rows = LazyRows.of(centred)
    (num, dim), shift = rows.shape, 1 / (rows.shape[0] - 1)
    s = float(dim - 2 if riesz_s is None else riesz_s)

    def bundled(part: slice) -> Tensor:  # [c_k, |c_k|^2, sigma_k^2, 0...]: 16 more columns keep the rows aligned
        chunk = rows[part]
        out = chunk.new_zeros(len(chunk), dim + 16)
        out[:, :dim], out[:, dim], out[:, dim + 1] = chunk, chunk.square().sum(1), variances[part]
        return out

    def columns(rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # contiguous: a strided broadcast is slow
        norms = rows[:, dim].contiguous()
        return norms, rows[:, dim + 1].mul(0.5), norms.sqrt().clamp_min_(1e-12).reciprocal_()

    space = _Workspace(rows.dtype, rows.device)
    wide = _Workspace(torch.float64, rows.device)

    def kernel(a: Tensor, b: Tensor) -> tuple[Tensor, ...]:  # into reused buffers, in place where it can
        shape = len(a), len(b)
        gram = torch.mm(a[:, :dim], b[:, :dim].mT, out=space("gram", *shape))
        (norm_a, half_a, inverse_a), (norm_b, half_b, inverse_b) = columns(a), columns(b)
        squared = torch.add(norm_a[:, None], norm_b[None, :], out=space("squared", *shape))
        squared.add_(gram, alpha=-2).clamp_min_(0)
        quotient = torch.add(half_a[:, None], half_b[None, :], out=space("quotient", *shape)).div_(squared)
        cosine = gram.mul_(inverse_a[:, None]).mul_(inverse_b[None, :])  # halves above: exact, as / (2 |.|^2)
        if cosine.dtype != torch.float64:
            cosine = cosine.to(torch.float64)
        unit_squared = torch.mul(cosine, -2, out=wide("unit", *shape)).add_(2).clamp_min_(0)  # 2 - 2 cos
        kernels = hyperspherical_kernels(unit_squared, s, wide("log", *shape), wide("riesz", *shape))
        return (cosine.add_(shift).abs_(), quotient, *kernels)

    out = pair_moments(LazyRows((num, dim + 16), rows.dtype, rows.device, bundled), kernel,
                       (False, False, True, True, True), tile)
    result = {"nc2_equiangle": out[0], "cdnv": out[1]}
    for name, (mean, variance) in zip(KERNELS, out[2:]):
        result |= {f"nc2g_{name}_mean": mean, f"nc2g_{name}_var": variance}
    return result


def etf_error(A: Rows, B: Rows | None = None, gram: Tensor | None = None) -> Tensor:
    r"""Distance of the normalised cross-Gram ``B A^T`` (K x K) from the simplex ETF's Gram, in O(K d^2).

    :math:`\lVert S/\lVert S\rVert_F - (I - \mathbf 1\mathbf 1^\top/K)/\sqrt{K-1}\rVert_F` with
    :math:`S = B A^\top` (Kothapalli 2023, "structure error"; NC2 for B = A = the class means centred on their
    mean, NC3 "self-duality" for B = W, as rhubarbwu/neural-collapse ``measure.py`` computes them).

    NC2 (``B`` None; rows of ``A`` summing to zero): S = A A^T commutes with P = I - 11^T/K, so the error is
    the spread of S's eigenvalues on range(P) about ``|S|_F / sqrt(K-1)``, from the eigenvalues of the
    d x d matrix A^T A; exact to rounding even at an ETF. NC3: both matrices have unit norm, so the square
    is :math:`2 - 2\langle S, E\rangle/\lVert S\rVert_F` with :math:`\langle S, E\rangle = (\mathrm{tr}\,S -
    \mathbf 1^\top S\mathbf 1/K)/\sqrt{K-1}` and :math:`\lVert S\rVert_F^2 = \langle A^\top A, B^\top B\rangle`;
    the subtraction leaves an absolute error of about sqrt(eps) = 1.5e-8 near 0. ``gram``: A^T A
    (``cross_gram(A)``) where the caller has it (one O(K d^2) product for NC2 and NC3).
    """
    num, dim = A.shape
    gram = cross_gram(A) if gram is None else gram
    if B is None:
        eigenvalues = torch.linalg.eigvalsh(gram).flip(0)[: min(dim, num - 1)].clamp_min(0)
        level = eigenvalues.square().sum().sqrt() / math.sqrt(num - 1)
        spread = (eigenvalues - level).square().sum() + (num - 1 - eigenvalues.numel()) * level.square()
        return spread.sqrt() / (level * math.sqrt(num - 1))
    norm = (gram * cross_gram(B)).sum().clamp_min(0).sqrt()
    trace = row_dots(A, B).sum()
    total = row_sum(A) @ row_sum(B)
    inner = (trace - total / num) / math.sqrt(num - 1)
    return (2 - 2 * inner / norm).clamp_min(0).sqrt()
