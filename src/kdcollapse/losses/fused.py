"""Language-model distillation losses fused with the student's output head: no (N, V) tensor.

Given the student's last hidden states h (N, H) and its head weight W (V, H), the logits z = h Wᵀ are
formed ``chunk_size`` tokens at a time; each chunk's loss and its gradient in z are computed at once
(inside the forward pass, as Liger-Kernel's fused linear losses do) and turned into the chunk's
gradients in h and W, so that neither the student's nor the teacher's full logits ever exist. The
teacher is one of: its logits (N, V) (:class:`TeacherLogits`), its own hidden states and head
(:class:`TeacherHead`, logits formed per chunk too), or stored top-k log-probabilities with the rest's
mass (:class:`TopKTeacher`). Values and gradients equal the unfused loss (``tests/test_losses_fused.py``).

The loss is ``ce_weight``·CE(z, labels) + ``distill_weight``·D(p_teacher ‖ q_student), both the mean
over the kept tokens (``mask`` set and label not ``ignore_index``), D any declared token divergence
(:func:`kdcollapse.losses.llm.token_divergences`) at temperature τ with its named parameters
(``fused_head_loss(h, W, teacher, "jsd", beta=0.3)``); one that needs each row's target token (``dkd``: DKD
with α = 1 and β = ``beta``, equal to ``dkd_loss(..., alpha=1, beta=β, temperature=τ) / τ²``) takes the
label of each row. The teacher receives no gradient.

DKD on stored top-k teacher tokens (``TopKTeacher.tail``): with the rule "uniform", the teacher's target
probability p_y, hence TCKD's split [p_y, 1 − p_y], is exact when y is among the teacher's top k and is the even
share of the rest's mass, (rest)/(V − k), when it is not; the non-target distribution keeps the top k (less y)
exactly and spreads the rest evenly, as the forward KL on stored tokens does. With the rule "rest", DKD is taken
over the k + 1 outcomes (the top k, the rest), y's outcome being the rest when y is not in the top k.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import _token_references
from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses._reduce import IGNORE_INDEX
from kdcollapse.losses._shapes import check_positive, check_tensor
from kdcollapse.losses.llm import divergence_gradient, divergence_info, divergence_rows


@dataclass(frozen=True)
class TeacherLogits:
    """The teacher's logits (N, V_t), V_t ≥ V (a padded teacher head is cut to the student's V)."""

    logits: Tensor

    def log_probs(self, rows: slice, vocab: int, temperature: float) -> Tensor:
        return F.log_softmax(_scaled(_upcast(self.logits[rows, :vocab]), temperature), -1)


@dataclass(frozen=True)
class TeacherHead:
    """The teacher's last hidden states (N, H_t) and head weight (V_t, H_t): its logits per chunk."""

    hidden: Tensor
    weight: Tensor

    def log_probs(self, rows: slice, vocab: int, temperature: float) -> Tensor:
        logits = self.hidden[rows] @ self.weight[:vocab].T
        return F.log_softmax(_scaled(_upcast(logits), temperature), -1)


TAILS = ("uniform", "rest")  # what a loss on stored top-k tokens does with the rest's mass (TopKTeacher)


@dataclass(frozen=True)
class TopKTeacher:
    """Stored teacher tokens: the top-k log-probabilities (N, k) at ``indices`` (N, k) and the log of
    the remaining mass (N,), all at ``temperature``. ``tail`` says what a loss makes of the remaining mass:

    - ``"uniform"``: it is spread evenly over the other V − k tokens, so the teacher is a distribution over the V
      tokens whose top k and rest's total are exact (the image path's ``teacher.cache_topk`` uses the same rule).
      Its tail is flat where the teacher's is not: on SmolLM2-135M's test text at k = 64 this distribution's own
      perplexity is 26.6 against the teacher's 17.4 (``teacher_lm``'s ``test_uniform_tail_perplexity``), a floor a
      student matching it cannot go below.
    - ``"rest"``: the divergence compares the two distributions coarsened to k + 1 outcomes, the teacher's top k
      tokens one by one and all the others as one (the student's mass there is the sum of its probabilities
      outside the teacher's top k). Every number it uses is exact; the student's distribution inside the rest is
      left as it is (a gradient scales it as a whole). For an f-divergence it is a lower bound of the divergence
      between the full distributions (the data-processing inequality), equal to it when k = V. For an
      f-divergence with a declared gradient it is computed as the divergence against the teacher whose rest follows
      the student's own shape (:meth:`self_shaped`: equal value and gradient, ``Divergence.f_divergence``), else
      through autograd on the coarsened rows.

    With k = V both rules are the full distribution."""

    log_probs_topk: Tensor
    indices: Tensor
    log_rest: Tensor
    temperature: float = 1.0
    tail: str = "uniform"

    def __post_init__(self):
        if self.tail not in TAILS:
            raise KdcollapseError(f"tail must be one of {', '.join(TAILS)}, got {self.tail!r}")

    @classmethod
    def from_logits(cls, logits: Tensor, k: int, temperature: float = 1.0, tail: str = "uniform") -> TopKTeacher:
        """The top ``k`` of softmax(``logits`` / τ) per row (N, V), their log-probabilities in float32, and
        the log of the rest's mass (−inf when k = V), computed from the log-probabilities in float32."""
        vocab = logits.shape[-1]
        if not (isinstance(k, int) and 1 <= k <= vocab):
            raise KdcollapseError(f"k must be an int in [1, {vocab}], got {k!r}")
        log_p = F.log_softmax(logits.float() / temperature, -1)
        values, indices = log_p.topk(k, dim=-1)
        log_rest = log_p.scatter(-1, indices, float("-inf")).logsumexp(-1)
        return cls(values, indices.to(torch.int32), log_rest, temperature, tail)

    def coarse(self, vocab: int) -> bool:
        """Whether a loss compares the coarsened distributions (``tail="rest"`` and k < V)."""
        return self.tail == "rest" and self.indices.shape[1] < vocab

    def _check(self, temperature: float) -> None:
        if temperature != self.temperature:
            raise KdcollapseError(f"stored teacher tokens hold probabilities at temperature {self.temperature}; "
                                  f"the loss asks for {temperature} (store them again at that temperature)")

    def log_probs(self, rows: slice, vocab: int, temperature: float) -> Tensor:
        """The teacher over the V tokens (rule "uniform", or k = V): (n, V) log-probabilities of ``rows``."""
        self._check(temperature)
        if self.coarse(vocab):
            raise KdcollapseError(f"stored teacher tokens with tail='rest' give no distribution over the {vocab} "
                                  f"tokens (only over the top {self.indices.shape[1]} and the rest); this loss needs "
                                  "one: use tail='uniform'")
        values, indices = self.log_probs_topk[rows].float(), self.indices[rows].long()
        k = indices.shape[1]
        if k == vocab:
            return torch.empty_like(values).scatter_(1, indices, values)
        fill = self.log_rest[rows].float() - torch.log(torch.tensor(float(vocab - k)))
        return fill.unsqueeze(1).expand(len(fill), vocab).clone().scatter_(1, indices, values)

    def self_shaped(self, rows: slice, log_q: Tensor, temperature: float) -> Tensor:
        """Rule "rest" for an f-divergence (``Divergence.f_divergence``): the teacher over the V tokens whose top k
        are exact and whose rest's mass follows the student's ``log_q`` (n, V) there, log p_j = log rest + log q_j −
        log Σ_rest q (no gradient: see ``Divergence``)."""
        self._check(temperature)
        indices = self.indices[rows].long()
        log_q = log_q.detach()
        rest_q = log_q.scatter(1, indices, float("-inf")).logsumexp(-1, keepdim=True)
        fill = log_q + (self.log_rest[rows].to(log_q.dtype).unsqueeze(1) - rest_q)
        return fill.scatter_(1, indices, self.log_probs_topk[rows].to(log_q.dtype))

    def coarsened(self, rows: slice, log_q: Tensor, target: Tensor | None, temperature: float):
        """Rule "rest": the student's ``log_q`` (n, V) and the teacher's log-probabilities as (n, k + 1)
        distributions (the top k, then the rest), and ``target`` (n,) as its outcome there (its place in the top
        k, else k); differentiable in ``log_q``."""
        self._check(temperature)
        indices = self.indices[rows].long()
        k = indices.shape[1]
        rest_q = log_q.scatter(1, indices, float("-inf")).logsumexp(-1, keepdim=True)
        coarse_q = torch.cat([log_q.gather(1, indices), rest_q], 1)
        coarse_p = torch.cat([self.log_probs_topk[rows], self.log_rest[rows].unsqueeze(1)], 1).to(log_q.dtype)
        if target is not None:
            hit = indices == target.unsqueeze(1)
            target = torch.where(hit.any(1), hit.float().argmax(1), k)
        return coarse_q, coarse_p, target


def _upcast(x: Tensor) -> Tensor:
    """float32 for half precision, float64 kept."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _scaled(z: Tensor, temperature: float) -> Tensor:
    """``z / temperature``; at τ = 1 ``z`` itself (the same values: no pass over an (N, V) chunk, forward or
    backward)."""
    return z if temperature == 1 else z / temperature


Teacher = TeacherLogits | TeacherHead | TopKTeacher


@register_loss("fused_head", kind="tokens", paper="Liger-Kernel (Hsu et al. 2024), fused linear losses; "
               "the divergences of GKD and DistiLLM", equation="ce_weight·CE + distill_weight·D(p_t ‖ q_s), "
               "z = h Wᵀ chunk by chunk", temperature=True, sequences=True, ignore_index=True, chunked=True, compiles=False,
               inputs=lambda: (torch.randn(6, 4, dtype=torch.float64, requires_grad=True),
                               torch.randn(5, 4, dtype=torch.float64, requires_grad=True),
                               TeacherLogits(torch.randn(6, 5, dtype=torch.float64))),
               reference=_token_references.fused_head)
def fused_head_loss(hidden: Tensor, weight: Tensor, teacher: Teacher | None, divergence: str = "forward_kl",
                    temperature: float = 1.0, *, labels: Tensor | None = None, ce_weight: float = 0.0,
                    distill_weight: float = 1.0, mask: Tensor | None = None, ignore_index: int = IGNORE_INDEX,
                    chunk_size: int = 1024, **parameters: float) -> Tensor:
    """``ce_weight``·CE + ``distill_weight``·``divergence`` of the student logits ``hidden @ weight.T``
    against ``teacher``, computed ``chunk_size`` tokens at a time (module doc).

    ``hidden`` (N, H) and ``weight`` (V, H) of one floating dtype (bf16 logits accumulate in float32);
    ``labels`` (N,) with ``ignore_index`` (needed when ``ce_weight`` > 0); ``mask`` (N,) bool or 0/1;
    ``parameters``: the divergence's named parameters (``beta`` of ``jsd`` and ``dkd``, ``alpha`` of the
    skew KLs; missing ones take their declared defaults; ``dkd`` needs ``labels``: the target of every row);
    ``teacher`` may be None when
    ``distill_weight`` is 0 (cross-entropy only). Returns the scalar loss; its
    gradients in ``hidden`` and ``weight`` are computed in the forward pass.
    """
    rows = divergence_rows(divergence, parameters, targets=True)
    with_target = divergence_info(divergence).divergence.target
    # the declared gradient forms ∂loss/∂z without autograd: when there is a divergence term and the CE, if any,
    # shares its log-softmax (τ = 1)
    coarse = isinstance(teacher, TopKTeacher) and teacher.coarse(weight.shape[0])
    gradient = divergence_gradient(divergence, parameters) if distill_weight and (not ce_weight or temperature == 1) \
        and (not coarse or divergence_info(divergence).divergence.f_divergence) else None  # else autograd
    check_positive("temperature", temperature)
    check_tensor("hidden", hidden, (2,))
    check_tensor("weight", weight, (2,))
    if hidden.shape[1] != weight.shape[1] or hidden.dtype != weight.dtype:
        raise KdcollapseError(f"hidden (N, H) and weight (V, H) must share H and dtype, got "
                              f"{tuple(hidden.shape)} {hidden.dtype} and {tuple(weight.shape)} {weight.dtype}")
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise KdcollapseError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if not (torch.isfinite(hidden).all() and torch.isfinite(weight).all()):
        raise KdcollapseError("hidden or weight contains NaN or inf")
    if teacher is None and distill_weight:
        raise KdcollapseError("a teacher is needed unless distill_weight is 0 (cross-entropy only)")
    if isinstance(teacher, (TeacherLogits, TeacherHead)):
        rows_and_vocab = ((teacher.logits.shape[0], teacher.logits.shape[-1]) if isinstance(teacher, TeacherLogits)
                          else (teacher.hidden.shape[0], teacher.weight.shape[0]))
        if rows_and_vocab[0] != hidden.shape[0] or rows_and_vocab[1] < weight.shape[0]:
            raise KdcollapseError(f"the teacher gives {rows_and_vocab[0]} tokens x {rows_and_vocab[1]} classes; the "
                                  f"student has {hidden.shape[0]} tokens x {weight.shape[0]} (a teacher vocabulary "
                                  f"may be padded beyond the student's, not smaller)")
    if ce_weight and labels is None:
        raise KdcollapseError("ce_weight > 0 needs labels")
    if distill_weight and with_target and labels is None:
        raise KdcollapseError(f"divergence {divergence!r} needs labels (the target token of every row)")
    keep = _kept(hidden.shape[0], labels, mask, ignore_index, hidden.device)
    if labels is not None and labels.numel() and bool(((labels < 0) | (labels >= weight.shape[0]))[keep].any()):
        raise KdcollapseError(f"labels must be in [0, {weight.shape[0]}) (or ignore_index), got "
                              f"{labels[keep].min().item()}..{labels[keep].max().item()}")
    return _FusedHead.apply(hidden, weight, teacher, rows, temperature, labels, keep, float(ce_weight),
                            float(distill_weight), chunk_size, with_target, gradient)


def _kept(n: int, labels: Tensor | None, mask: Tensor | None, ignore_index: int, device) -> Tensor:
    keep = torch.ones(n, dtype=torch.bool, device=device)
    if mask is not None:
        if tuple(mask.shape) != (n,) or mask.dtype.is_floating_point:
            raise KdcollapseError(f"mask must be a bool or 0/1 tensor of shape ({n},), got {tuple(mask.shape)} "
                                  f"{mask.dtype}")
        keep &= mask.bool()
    if labels is not None:
        if tuple(labels.shape) != (n,) or labels.dtype.is_floating_point:
            raise KdcollapseError(f"labels must be an integer tensor of shape ({n},), got {tuple(labels.shape)}")
        keep &= labels != ignore_index
    if not keep.any():
        raise KdcollapseError("no token is kept (every position masked or labelled ignore_index)")
    return keep


def _autograd_gradient(h, weight, teacher, span, vocab, temperature, rows, kept, count, labels, ce_weight,
                       distill_weight, with_target):
    """One chunk's loss and its gradient in the logits z, by autograd through the divergence's rows."""
    with torch.enable_grad():
        z = _upcast(h @ weight.T).detach().requires_grad_()
        log_q = F.log_softmax(_scaled(z, temperature), -1)
        values = torch.zeros(len(z), dtype=z.dtype)
        target = None if labels is None else torch.where(kept, labels[span], 0).long()
        if distill_weight and isinstance(teacher, TopKTeacher) and teacher.coarse(vocab):
            coarse_q, coarse_p, coarse_target = teacher.coarsened(span, log_q, target, temperature)
            values = distill_weight * (rows(coarse_q, coarse_p, coarse_target) if with_target
                                       else rows(coarse_q, coarse_p))
        elif distill_weight:
            log_p = teacher.log_probs(span, vocab, temperature).to(z.dtype)
            values = distill_weight * (rows(log_q, log_p, target) if with_target else rows(log_q, log_p))
        if ce_weight:  # −log softmax(z)[y], from the divergence's log-softmax when τ = 1
            log_z = log_q if temperature == 1 else F.log_softmax(z, -1)
            values = values - ce_weight * log_z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        loss = torch.where(kept, values, 0).sum() / count
        (grad_z,) = torch.autograd.grad(loss, z)
    return loss, grad_z


def _declared_gradient(z, teacher, span, vocab, temperature, gradient, kept, count, labels, ce_weight,
                       distill_weight):
    """One chunk's loss and ∂loss/∂z from the divergence's declared gradient g = ∂values/∂log_q: with w the rows'
    weights and log_q = log_softmax(z / τ), ∂loss/∂z = (G − q Σ_v G) / τ, G = w g (minus the CE's one-hot)."""
    log_q = F.log_softmax(_scaled(z, temperature), -1)
    log_p = teacher.self_shaped(span, log_q, temperature) if isinstance(teacher, TopKTeacher) and teacher.coarse(vocab) \
        else teacher.log_probs(span, vocab, temperature).to(z.dtype)
    values, g = gradient(log_q, log_p)
    count = count.to(z.dtype)  # the weights in z's precision (an int count would divide in float32)
    weights = torch.where(kept, distill_weight / count, 0)
    loss = torch.where(kept, weights * values, 0).sum()
    g.mul_(weights.unsqueeze(1))
    if not bool(kept.all()):  # a left-out row adds nothing, whatever its values
        g.masked_fill_(~kept.unsqueeze(1), 0)
    if ce_weight:  # −log q_y (τ = 1 here): ∂/∂log_q is −1 at y
        target = torch.where(kept, labels[span], 0).long().unsqueeze(1)
        ce_rows = torch.where(kept, ce_weight / count, 0).unsqueeze(1)
        loss = loss - (ce_rows * log_q.gather(1, target)).sum()
        g.scatter_add_(1, target, -ce_rows)
    grad_z = g.sub_(log_q.exp_().mul_(g.sum(-1, keepdim=True)))
    return loss, grad_z if temperature == 1 else grad_z.div_(temperature)


class _FusedHead(torch.autograd.Function):
    """Forward: loss and gradients chunk by chunk. Backward: the stored gradients times the incoming one."""

    @staticmethod
    def forward(ctx, hidden, weight, teacher, rows, temperature, labels, keep, ce_weight, distill_weight,
                chunk_size, with_target, gradient=None):
        vocab, count = weight.shape[0], keep.sum()
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32 if weight.dtype != torch.float64
                                  else weight.dtype, device=weight.device) if ctx.needs_input_grad[1] else None
        total = torch.zeros((), dtype=torch.float64, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            span = slice(start, start + chunk_size)
            kept = keep[span]
            h = hidden[span]
            if gradient is not None:
                loss, grad_z = _declared_gradient(_upcast(h @ weight.T), teacher, span, vocab, temperature, gradient,
                                                  kept, count, labels, ce_weight, distill_weight)
            else:
                loss, grad_z = _autograd_gradient(h, weight, teacher, span, vocab, temperature, rows, kept, count,
                                                  labels, ce_weight, distill_weight, with_target)
            total += loss.detach()
            grad_z = grad_z.to(hidden.dtype)
            if grad_hidden is not None:
                torch.mm(grad_z, weight, out=grad_hidden[span])
            if grad_weight is not None and grad_weight.dtype == h.dtype:
                grad_weight.addmm_(grad_z.T, h)  # accumulated inside the GEMM: no (V, H) temporary per chunk
            elif grad_weight is not None:
                grad_weight += (grad_z.T @ h).to(grad_weight.dtype)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype) if grad_weight is not None else None)
        return total.to(torch.promote_types(hidden.dtype, torch.float32))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (None if grad_hidden is None else grad_hidden * grad_output.to(grad_hidden.dtype),
                None if grad_weight is None else grad_weight * grad_output.to(grad_weight.dtype),
                *([None] * 10))
