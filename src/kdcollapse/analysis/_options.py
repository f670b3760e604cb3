"""How ``analyze`` runs. Kept free of torch, torchmetrics and matplotlib so that the command line can show
these defaults in ``kdcollapse analyze --help`` without loading them."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SAMPLE_SIZE = 20_000  # feature rows kept for t-SNE and nearest-class-mean, over all classes


@dataclass
class AnalyzeOptions:
    """How ``analyze`` runs: batching, the bounded feature sample, t-SNE and progress display."""

    batch_size: int = 512
    sample_size: int = DEFAULT_SAMPLE_SIZE  # feature rows kept (t-SNE, NC4), about evenly per class
    tsne_classes: list[int] | None = None  # None: the first min(K, 10) classes
    tsne_per_class: int = 0  # t-SNE points per class; 0: no t-SNE (it costs more than the pass itself)
    seed: int = 0  # the feature sample and t-SNE
    progress: bool = True
    precision: str = "off"  # autocast of the forward passes: off | auto | bf16 | fp16 (CUDA); metrics stay float64
    channels_last: bool = False  # memory layout of image inputs, model and teacher
    stages: list[int] | None = None  # also these stages' pooled maps ([]: every stage; None: the penultimate only)
