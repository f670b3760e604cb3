"""One streaming pass over a split: penultimate features, logits and everything computed from them.

``feature_pass`` runs the model once over a loader (eval mode, no gradients) and feeds, batch by batch,
the collapse statistics (``FeatureStatistics``), the logit margins of the main head, a bounded
class-stratified sample of features (for t-SNE and the nearest-class-mean classifier), each head's
accuracy and, with a teacher, each head's teacher-minus-student class logit matrix (DHKD App. H).
Memory: O(K d + d^2) statistics, one float per sample for the margins, and at most
``sample_per_class`` feature rows per class.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from kdcollapse.analysis._options import DEFAULT_SAMPLE_SIZE
from kdcollapse.analysis._logits import ClassLogitMatrix, logit_margins
from kdcollapse.analysis._sample import ClassReservoir
from kdcollapse.analysis._stages import resolve_stages, stage_forward
from kdcollapse.data import USER_DATA, FolderDataset, TensorDataset, as_dataset, make_loader
from kdcollapse.distributed import autocast
from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import FeatureMean, FeatureStatistics, collapse_metrics, nearest_class_mean
from kdcollapse.models import FeatureSpec, as_classifier, evaluating



@dataclass
class SplitPass:
    """What one pass over a split accumulated; see :func:`feature_pass`."""

    stats: FeatureStatistics
    sample: ClassReservoir  # columns "features" (n, d), "prediction" (n,) of the main head and "index" (n,): each
    # row's position in the pass (loader order, from 0)
    margins: Tensor  # (N,) main-head logit margins z_y - max_{j != y} z_j, in loader order
    labels: Tensor  # (N,)
    correct: dict[str, int]  # per head: samples classified correctly
    logit_matrices: dict[str, ClassLogitMatrix] = field(default_factory=dict)  # per head: M^t - M^s
    stages: dict[str, FeatureStatistics] = field(default_factory=dict)  # "stage<i>": its pooled map's statistics

    @property
    def num_samples(self) -> int:
        return self.labels.numel()


def sample_per_class(sample_size: int, num_classes: int) -> int:
    """Rows per class kept by a sample of about ``sample_size`` rows in all."""
    if not isinstance(sample_size, int) or sample_size < 1:
        raise KdcollapseError(f"the feature sample size must be a positive int, got {sample_size!r}")
    return max(1, math.ceil(sample_size / num_classes))


def feature_pass(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    *,
    num_classes: int,
    heads: Mapping[str, nn.Module] | None = None,
    teacher: nn.Module | None = None,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed: int = 0,
    progress: bool = False,
    description: str = "features",
    features: FeatureSpec = None,
    precision: torch.dtype | None = None,
    channels_last: bool = False,
    stages: list[int] | None = None,
) -> SplitPass:
    """Run ``model`` once over ``batches`` of ``(x, y)`` and accumulate a :class:`SplitPass`.

    ``model`` is a :class:`~kdcollapse.models.Classifier` (``forward_features`` -> ``(B, d)``, ``forward_head``
    -> ``(B, K)``, the "main" head) or any module with the feature spec ``features`` (see
    :func:`~kdcollapse.models.as_classifier`); ``heads`` maps names to extra heads on the same features (DHKD's
    auxiliary head ``g'``); ``teacher`` is a model whose logits are compared with every head's
    (DHKD App. H). The sample keeps about ``sample_size`` feature rows, ``ceil(sample_size / K)`` per
    class, drawn with ``seed``. Modes are restored afterwards, so this is safe inside a training loop.
    ``precision`` (a dtype or None) runs the forward passes under autocast and ``channels_last`` feeds
    image batches in that layout (the modules must be in it already); every statistic is accumulated
    in float32 or float64 whatever the precision. ``batches`` may also be a dataset — kdcollapse's, or a
    torch ``Dataset`` / ``DataLoader`` of ``(x, y)`` read by :func:`user_split` —
    which is then batched by 512 on the model's device.
    """
    model = as_classifier(model, features)
    stage_list = resolve_stages(model, stages)  # with stages: also each stage's pooled map, from the same pass
    stage_stats: dict[str, FeatureStatistics] = {}
    if isinstance(batches, (TensorDataset, FolderDataset, Dataset, DataLoader)):
        batches = make_loader(user_split(batches), 512, train=False, device=next(model.parameters()).device, seed=0)
    heads = dict(heads or {})
    if "main" in heads:
        raise KdcollapseError("'main' names the model's own head; give extra heads other names")
    modules = [model, *heads.values(), *([teacher] if teacher is not None else [])]
    stats = sample = None
    margins, labels = [], []
    seen = 0  # rows before this batch: the sampled rows' positions in the pass
    correct = {name: 0 for name in ("main", *heads)}
    matrices: dict[str, ClassLogitMatrix] = {}
    with evaluating(modules):
        for x, y in tqdm(batches, desc=description, disable=not progress, leave=False, dynamic_ncols=True):
            if channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            with autocast(x.device, precision):
                features, maps = stage_forward(model, x, stage_list)
                logits = {"main": model.forward_head(features), **{n: h(features) for n, h in heads.items()}}
                z_teacher = None if teacher is None else teacher(x)
            if stats is None:
                stats = FeatureStatistics(num_classes, features.shape[1], sync_on_compute=False).to(features.device)
                sample = ClassReservoir(num_classes, sample_per_class(sample_size, num_classes), seed)
                if teacher is not None:
                    matrices = {name: ClassLogitMatrix(num_classes, sync_on_compute=False).to(features.device)
                                for name in correct}
            features = features.float()  # bf16/fp16 features under autocast: statistics see float32 values
            stats.update(features, y)
            for index, pooled_map in zip(stage_list, maps):
                name = f"stage{index}"
                if name not in stage_stats:
                    stage_stats[name] = FeatureStatistics(num_classes, pooled_map.shape[1],
                                                          sync_on_compute=False).to(pooled_map.device)
                stage_stats[name].update(pooled_map, y)
            sample.update(y, features=features, prediction=logits["main"].argmax(1),
                          index=torch.arange(seen, seen + y.shape[0], device=y.device))
            seen += y.shape[0]
            margins.append(logit_margins(logits["main"].float(), y).cpu())
            labels.append(y.cpu())
            for name, z in logits.items():
                correct[name] += int((z.argmax(1) == y).sum())
            if teacher is not None:
                for name, z in logits.items():
                    matrices[name].update(z_teacher.double() - z.double(), y)
    if stats is None:
        raise KdcollapseError("the split is empty: no batches to analyse")
    return SplitPass(stats, sample, torch.cat(margins), torch.cat(labels), correct, matrices, stage_stats)


def user_split(data, normalization: tuple | None = None):
    """A kdcollapse dataset as it is; a torch ``Dataset`` or ``DataLoader`` read by
    :func:`kdcollapse.data.from_torch`, standardised with ``normalization`` ``(mean, std)`` (what a model
    loaded by kdcollapse was trained with: its ``input_normalization``), else fed to the model as it
    yields it (uint8 images scaled to [0, 1], nothing standardised)."""
    mean, std = normalization or ((0.0,), (1.0,))
    return as_dataset(data, name=USER_DATA, mean=mean, std=std)


def classifier_weight(model: nn.Module) -> Tensor | None:
    """The ``(K, d)`` weight of a linear main head (for NC3, GNC2, GNC3), else None."""
    weight = getattr(getattr(model, "head", None), "weight", None)
    expected = (getattr(model, "num_classes", None), getattr(model, "feature_dim", None))
    return weight if isinstance(weight, Tensor) and tuple(weight.shape) == expected else None


def ood_mean(model: nn.Module, dataset, *, in_distribution, batch_size: int = 512, precision=None,
             features: FeatureSpec = None) -> Tensor:
    """The mean penultimate feature of ``model`` over an out-of-distribution ``dataset`` (NC5, ``ood_mean`` of
    ``collapse_metrics``): its inputs standardised as ``in_distribution``'s (what the model was trained on)."""
    model = as_classifier(model, features)
    if tuple(dataset.input_shape) != tuple(in_distribution.input_shape):
        raise KdcollapseError(f"the OOD data '{dataset.name}' has inputs of shape {tuple(dataset.input_shape)}, the "
                              f"model's '{in_distribution.name}' {tuple(in_distribution.input_shape)}")
    if hasattr(dataset, "__dataclass_fields__") and "mean" in dataset.__dataclass_fields__:
        import dataclasses

        dataset = dataclasses.replace(dataset, mean=in_distribution.mean, std=in_distribution.std)
    device = next(model.parameters()).device
    mean = None
    with evaluating([model]):
        for x, _ in make_loader(dataset, batch_size, train=False, device=device, seed=0):
            with autocast(x.device, precision):
                h = model.forward_features(x).float()
            if mean is None:
                mean = FeatureMean(h.shape[1], sync_on_compute=False).to(h.device)
            mean.update(h)
    if mean is None:
        raise KdcollapseError(f"the OOD data '{dataset.name}' is empty")
    return mean.compute()


def split_metrics(result: SplitPass, weight: Tensor | None,
                  ood: Tensor | None = None) -> dict[str, float | int | bool]:
    """Every collapse metric of the pass (``collapse_metrics`` with the head ``weight``), the accuracy of
    each head (``accuracy``, ``accuracy_<head>``; fractions) and NC4 from the feature sample.

    NC4 (``ncc_accuracy``, ``ncc_agreement``) needs the class means before it can classify, so it runs on
    the sample with the means of the full pass: per-class rates weighted by the class prior n_k / N.
    Exact when the sample holds the whole split (``ncc_exact``); otherwise an unbiased estimate from
    ``ncc_samples`` rows, standard error at most 0.5 / sqrt(rows per class).
    """
    computed = collapse_metrics(result.stats, weight, ood_mean=ood)
    out = {k: float(v) if v.is_floating_point() else int(v) for k, v in computed.items()}
    n = result.num_samples
    out |= {"accuracy" if name == "main" else f"accuracy_{name}": c / n for name, c in result.correct.items()}
    sample = result.sample
    columns = sample.columns
    nearest = nearest_class_mean(columns["features"], result.stats.class_means().cpu())
    prior = result.stats.class_counts.cpu().double() / n
    k = result.stats.num_classes
    for key, target in (("ncc_accuracy", sample.labels), ("ncc_agreement", columns["prediction"])):
        hits = torch.zeros(k, dtype=torch.float64).index_add_(0, sample.labels, (nearest == target).double())
        rate = hits / torch.bincount(sample.labels, minlength=k).double()
        out[key] = float((prior * rate).sum())
    out["ncc_samples"] = sample.labels.numel()
    out["ncc_exact"] = sample.exact
    return out
