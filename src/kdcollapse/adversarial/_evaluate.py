"""Robustness evaluation: a chain of attacks, each run only on the points still robust, with the
AutoAttack "standard" chain (Croce & Hein, ICML 2020) and a quick PGD-k evaluation built on it."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

from kdcollapse.adversarial._apgd import apgd_attack, apgd_targeted_attack
from kdcollapse.adversarial._common import (
    Model,
    check_count,
    check_inputs,
    check_norm_eps,
    eval_mode,
    in_threat_model,
    num_classes,
    predict,
    search_model,
)
from kdcollapse.adversarial._fab import fab_attack
from kdcollapse.adversarial._losses import require_classes
from kdcollapse.adversarial._pgd import pgd_attack
from kdcollapse.adversarial._square import square_attack
from kdcollapse.errors import KdcollapseError, unknown_choice

AttackFn = Callable[[Model, Tensor, Tensor], Tensor]  # (model, x, y) -> x_adv for that batch
VERSIONS = ("standard",)


@dataclass(frozen=True)
class AttackStage:
    """One attack of a chain: how many points it was given, how many it broke, and its cost."""

    name: str
    attacked: int
    broken: int
    robust_accuracy: float  # over all points, after this attack
    seconds: float

    @property
    def images_per_second(self) -> float:
        return self.attacked / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class RobustEvaluation:
    """Result of :func:`evaluate_attacks`. ``x_adv`` holds the adversarial example of every broken
    point and the clean input of every other one; ``robust`` flags the points no attack broke (as
    re-checked on ``x_adv`` at the end)."""

    norm: str
    eps: float
    clean_accuracy: float
    robust_accuracy: float
    stages: list[AttackStage]
    x_adv: Tensor = field(repr=False)
    robust: Tensor = field(repr=False)
    unconfirmed: int = 0  # broken during the chain but classified correctly by the final re-check

    def summary(self) -> dict:
        """JSON-ready numbers (no tensors)."""
        return {
            "norm": self.norm, "eps": self.eps, "n": len(self.robust),
            "clean_accuracy": self.clean_accuracy, "robust_accuracy": self.robust_accuracy,
            "unconfirmed": self.unconfirmed,
            "stages": [
                {"attack": s.name, "attacked": s.attacked, "broken": s.broken, "robust_accuracy": s.robust_accuracy,
                 "seconds": s.seconds, "images_per_second": s.images_per_second}
                for s in self.stages
            ],
        }

    def table(self) -> str:
        """A markdown table: clean accuracy, then robust accuracy after each attack."""
        lines = ["| stage | attacked | broken | accuracy | time (s) | images/s |", "|---|---:|---:|---:|---:|---:|",
                 f"| clean | {len(self.robust)} | | {self.clean_accuracy:.2%} | | |"]
        lines += [f"| {s.name} | {s.attacked} | {s.broken} | {s.robust_accuracy:.2%} | {s.seconds:.1f} | "
                  f"{s.images_per_second:.1f} |" if s.attacked else f"| {s.name} | 0 | | {s.robust_accuracy:.2%} | | |"
                  for s in self.stages]
        return "\n".join(lines)


def _predict_batched(model: Model, x: Tensor, batch_size: int) -> Tensor:
    return torch.cat([predict(model, chunk) for chunk in x.split(batch_size)])


def evaluate_attacks(
    model: Model,
    x: Tensor,
    y: Tensor,
    attacks: Sequence[tuple[str, AttackFn]],
    *,
    norm: str,
    eps: float,
    batch_size: int = 500,
    progress: bool = True,
    precision: str = "off",
    channels_last: bool = False,
) -> RobustEvaluation:
    """Run ``attacks`` in order, each only on the points still classified correctly, in batches.

    ``precision`` (off | auto | bf16 | fp16) and ``channels_last`` speed up the attacks' search only
    (:func:`search_model`); every verdict — clean accuracy, each candidate, the final check — is the
    float32 model's. A point counts as broken when an attack returns an input that the model misclassifies. Every
    returned input must lie in the ε-ball ∩ [0, 1] box (else ``RuntimeError``: the attack is wrong).
    At the end all of ``x_adv`` is checked again (ball, box, prediction); the reported robust accuracy
    is that of the final check.
    """
    check_inputs(x, y, model)
    check_norm_eps(norm, eps)
    check_count("batch_size", batch_size)
    search = search_model(model, x, precision, channels_last)
    with eval_mode(model):
        correct = _predict_batched(model, x, batch_size) == y
        clean_accuracy = correct.float().mean().item()
        robust = correct.clone()
        x_adv, stages = x.clone(), []
        for name, attack in attacks:
            idx = robust.nonzero().squeeze(1)
            start, broken = time.perf_counter(), 0
            with tqdm(total=idx.numel(), desc=name, unit="img", disable=not progress) as bar:
                for chunk in idx.split(batch_size) if idx.numel() else ():  # split() of nothing is [nothing]
                    candidates = attack(search, x[chunk], y[chunk])
                    outside = ~in_threat_model(candidates, x[chunk], norm, eps)
                    if outside.any():
                        raise RuntimeError(f"attack {name!r} returned {int(outside.sum())} inputs outside the "
                                           f"{norm} ball of radius {eps} or the [0, 1] box")
                    fooled = predict(model, candidates) != y[chunk]
                    x_adv[chunk[fooled]] = candidates[fooled]
                    robust[chunk[fooled]] = False
                    broken += int(fooled.sum())
                    bar.update(chunk.numel())
                    bar.set_postfix(robust=f"{robust.float().mean().item():.2%}")
            stages.append(AttackStage(name, idx.numel(), broken, robust.float().mean().item(),
                                      time.perf_counter() - start))
        final, unconfirmed = _verify(model, x, y, x_adv, correct, robust, norm=norm, eps=eps, batch_size=batch_size)
    return RobustEvaluation(norm, eps, clean_accuracy, final.float().mean().item(), stages, x_adv, final,
                            unconfirmed)


def _verify(model: Model, x: Tensor, y: Tensor, x_adv: Tensor, correct: Tensor, robust: Tensor, *, norm: str,
            eps: float, batch_size: int) -> tuple[Tensor, int]:
    """The final check. Every x_adv must lie in the ball and box (else ``AssertionError``); a point is
    robust iff it was classified correctly at the start and its x_adv still is on a fresh prediction.
    Points broken during the chain that the fresh prediction classifies correctly (possible only with a
    nondeterministic model or kernels) thus count as robust; their number is returned and warned about.
    """
    outside = ~in_threat_model(x_adv, x, norm, eps)
    if outside.any():
        raise AssertionError(f"{int(outside.sum())} adversarial examples lie outside the threat model")
    final = correct & (_predict_batched(model, x_adv, batch_size) == y)
    unconfirmed = int((final & ~robust).sum())
    if unconfirmed:
        warnings.warn(f"{unconfirmed} adversarial examples are classified correctly on the final check "
                      "(nondeterministic model?); they count as robust", RuntimeWarning, stacklevel=3)
    return final, unconfirmed


def autoattack_chain(
    norm: str, eps: float, *, n_iter: int = 100, n_targets: int = 9, n_queries: int = 5000,
    generator: torch.Generator | None = None,
) -> list[tuple[str, AttackFn]]:
    """The attacks of AutoAttack "standard": APGD-CE (n_iter, 1 restart), APGD-T (n_targets × n_iter),
    FAB-T (n_targets × n_iter), Square (n_queries, p_init = 0.8). The defaults are the standard."""
    return [
        ("apgd-ce", lambda m, x, y: apgd_attack(m, x, y, norm=norm, eps=eps, n_iter=n_iter, loss="ce",
                                                generator=generator)),
        ("apgd-t", lambda m, x, y: apgd_targeted_attack(m, x, y, norm=norm, eps=eps, n_iter=n_iter,
                                                        n_targets=n_targets, generator=generator)),
        ("fab-t", lambda m, x, y: fab_attack(m, x, y, norm=norm, eps=eps, n_iter=n_iter, n_targets=n_targets)),
        ("square", lambda m, x, y: square_attack(m, x, y, norm=norm, eps=eps, n_queries=n_queries, p_init=0.8,
                                                 generator=generator)),
    ]


def _generator(x: Tensor, seed: int) -> torch.Generator:
    return torch.Generator(device=x.device).manual_seed(seed)


def autoattack_standard(
    model: Model,
    x: Tensor,
    y: Tensor,
    *,
    norm: str = "Linf",
    eps: float = 8 / 255,
    batch_size: int = 500,
    version: str = "standard",
    seed: int = 0,
    progress: bool = True,
    precision: str = "off",
    channels_last: bool = False,
) -> RobustEvaluation:
    """AutoAttack "standard" (Croce & Hein, ICML 2020): APGD-CE → APGD-T → FAB-T → Square, each on the
    points still robust. Our own implementations of the published algorithms, configured as the
    standard (100 iterations, 9 target classes, 5000 Square queries).

    Args:
        model: callable on [0, 1] images returning logits (wrap normalisation with ``Normalized``).
        x: (N, C, H, W) in [0, 1]; y: (N,) labels. Needs ≥ 4 classes (targeted DLR).
        seed: seeds the attacks' random starts, targets' restarts and Square's search.
        precision, channels_last: a faster search; verdicts stay float32 (see :func:`evaluate_attacks`).
    Returns:
        :class:`RobustEvaluation` with clean and robust accuracy, the per-attack breakdown and x_adv.
    """
    if version not in VERSIONS:
        raise KdcollapseError(unknown_choice("AutoAttack version", version, VERSIONS))
    check_inputs(x, y, model)
    check_norm_eps(norm, eps)
    require_classes(num_classes(model, x), 4, "AutoAttack standard (its APGD-T)")
    chain = autoattack_chain(norm, eps, generator=_generator(x, seed))
    return evaluate_attacks(model, x, y, chain, norm=norm, eps=eps, batch_size=batch_size, progress=progress,
                            precision=precision, channels_last=channels_last)


def pgd_evaluate(
    model: Model,
    x: Tensor,
    y: Tensor,
    *,
    norm: str = "Linf",
    eps: float = 8 / 255,
    steps: int = 20,
    step_size: float | None = None,
    batch_size: int = 500,
    seed: int = 0,
    progress: bool = True,
    precision: str = "off",
    channels_last: bool = False,
) -> RobustEvaluation:
    """Quick robustness estimate with PGD-k (Madry et al., ICLR 2018): cross-entropy, random start,
    ``steps`` steps of ``step_size`` (default 2.5·ε/steps). An upper bound on robust accuracy that is
    looser than :func:`autoattack_standard`."""
    check_norm_eps(norm, eps)
    check_count("steps", steps)
    step = 2.5 * eps / steps if step_size is None else step_size
    generator = _generator(x, seed)
    attack = lambda m, xb, yb: pgd_attack(m, xb, yb, norm=norm, eps=eps, step_size=step, steps=steps,  # noqa: E731
                                          generator=generator)
    return evaluate_attacks(model, x, y, [(f"pgd-{steps}", attack)], norm=norm, eps=eps, batch_size=batch_size,
                            progress=progress, precision=precision, channels_last=channels_last)
