"""Image-folder datasets (ImageNet, Tiny-ImageNet, any ``<split>/<class>/<image>`` tree), decoded with PIL.

Worker processes decode each image into a square uint8 tensor of ``image_size``; the loader then moves
batches to the device, applies the batched augmentation there and normalises (see ``_loader.py``).
Training images get a random-resized crop first when ``random_resized_crop`` is set (ImageNet);
otherwise, and for evaluation, an image is resized so its shorter side is ``resize`` and centre-cropped
to ``image_size`` (ImageNet: 256 -> 224; Tiny-ImageNet: 64 -> 64, which leaves its 64x64 images as
they are).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kdcollapse.data._dataset import Augment, _check_mean_std, register_dataset, relabel_classes, select_subset
from kdcollapse.errors import DataError

if TYPE_CHECKING:  # PIL loads on first decode: 0.4 s of every `import kdcollapse.train` otherwise
    from PIL import Image

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class FolderDataset:
    """A split given as image files and labels; images are decoded on demand.

    ``samples``: ``(path, label)`` pairs; ``image_size``: side of the square uint8 images produced;
    ``resize``: shorter side before the centre crop; ``random_resized_crop``: use the random-resized
    crop (scale 0.08-1, aspect 3/4-4/3) for training instead of resize + centre crop.
    """

    samples: list[tuple[str, int]]
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    name: str
    image_size: int
    resize: int
    random_resized_crop: bool = False
    default_augment: Augment = field(default_factory=Augment)

    def __post_init__(self) -> None:
        if not self.samples:
            raise DataError(f"{self.name}: no images found")
        _check_mean_std(self.name, self.mean, self.std, 3)

    @property
    def labels(self) -> torch.Tensor:
        return torch.tensor([label for _, label in self.samples], dtype=torch.int64)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (3, self.image_size, self.image_size)

    @property
    def in_channels(self) -> int:
        return 3

    full_scale = 255.0  # decoded images are uint8

    def __len__(self) -> int:
        return len(self.samples)

    def subset(self, n_per_class: int | None = None, *, indices: Any = None, seed: int = 0) -> FolderDataset:
        """Same as :meth:`TensorDataset.subset`."""
        index = select_subset(self.labels, self.num_classes, self.name, n_per_class, indices, seed)
        return replace(self, samples=[self.samples[i] for i in index.tolist()])

    def select_classes(self, classes: Sequence[int]) -> FolderDataset:
        """Same as :meth:`TensorDataset.select_classes`."""
        index, labels, names = relabel_classes(self.labels, self.classes, self.name, classes)
        return replace(self, samples=[(self.samples[i][0], y) for i, y in zip(index.tolist(), labels.tolist())],
                       classes=names)

    def decode(self, index: int, train: bool, seed: int) -> torch.Tensor:
        """Image ``index`` as uint8 ``(3, image_size, image_size)``; ``seed`` drives the random crop."""
        from PIL import Image

        path = self.samples[index][0]
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
        except Image.DecompressionBombError as err:  # PIL refuses images over 2 * Image.MAX_IMAGE_PIXELS pixels
            raise DataError(f"{path}: refused as a possible decompression bomb ({err})") from None
        except (OSError, SyntaxError, ValueError, EOFError) as err:  # PIL raises each for some broken file
            raise DataError(f"{path}: cannot decode image ({type(err).__name__}: {err})") from None
        if train and self.random_resized_crop:
            img = random_resized_crop(img, self.image_size, random.Random(seed))
        else:
            img = resize_center_crop(img, self.resize, self.image_size)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).contiguous()


def random_resized_crop(
    img: Image.Image, size: int, rng: random.Random, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)
) -> Image.Image:
    """Crop a random area fraction in ``scale``, aspect ratio in ``ratio`` (log-uniform); resize to size².

    After 10 failed draws it falls back to the largest centred crop whose aspect ratio lies in ``ratio``.
    """
    from PIL import Image

    width, height = img.size
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = rng.randint(0, height - h), rng.randint(0, width - w)
            break
    else:
        aspect = min(max(width / height, ratio[0]), ratio[1])
        w, h = (width, round(width / aspect)) if width / height < aspect else (round(height * aspect), height)
        top, left = (height - h) // 2, (width - w) // 2
    return img.resize((size, size), resample=Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))


def resize_center_crop(img: Image.Image, resize: int, size: int) -> Image.Image:
    """Resize so the shorter side is ``resize`` (bilinear, aspect kept), then crop the centre size²."""
    from PIL import Image

    width, height = img.size
    if min(width, height) != resize:
        scale = resize / min(width, height)
        width, height = max(resize, round(width * scale)), max(resize, round(height * scale))
        img = img.resize((width, height), resample=Image.Resampling.BILINEAR)
    if (width, height) == (size, size):
        return img
    top, left = round((height - size) / 2), round((width - size) / 2)
    return img.crop((left, top, left + size, top + size))


# --- layouts ----------------------------------------------------------------------------------------


def _images_in(folder: Path) -> list[str]:
    """Sorted image paths in ``folder`` (``scandir`` avoids a stat per file on 1.28M ImageNet images)."""
    try:
        with os.scandir(folder) as entries:
            return sorted(e.path for e in entries if e.name.lower().endswith(IMAGE_EXTENSIONS) and e.is_file())
    except OSError as err:
        raise DataError(f"{folder}: cannot list images ({err.strerror})") from None


def class_folders(split_dir: Path) -> list[str]:
    """The sorted names of the class folders in ``split_dir``."""
    if not split_dir.is_dir():
        raise DataError(f"{split_dir}: no such directory")
    classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{split_dir}: no class folders (expected {split_dir}/<class>/<image>)")
    return classes


def scan_class_folders(
    split_dir: Path, inner: str = "", classes: list[str] | None = None
) -> tuple[list[tuple[str, int]], list[str]]:
    """``split_dir/<class>/<inner>/<image>`` -> ``(path, label)`` samples and the class names.

    ``classes``: the names to expect, in label order (the training split's, so that an evaluation split is
    labelled by name); ``None``: the sorted folders found. Raises ``DataError`` listing the class folders
    that are missing or unexpected, and those without images.
    """
    found = class_folders(split_dir)
    if classes is None:
        classes = found
    missing, extra = sorted(set(classes) - set(found)), sorted(set(found) - set(classes))
    if missing or extra:
        raise DataError(f"{split_dir}: class folders differ from the training split's: "
                        + "; ".join(f"{what} {_names(names)}" for what, names in (("missing", missing),
                                    ("not in the training split", extra)) if names))
    images = [_images_in(split_dir / c / inner) for c in classes]
    empty = [c for c, paths in zip(classes, images) if not paths]
    if empty:
        raise DataError(f"{split_dir}: class folders without images: {_names(empty)}")
    samples = [(p, label) for label, paths in enumerate(images) for p in paths]
    return samples, classes


def _names(names: list[str], limit: int = 10) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{len(names)} ({', '.join(names[:limit])}{more})"


def _split_classes(root: Path, split: str, eval_dir: str) -> tuple[list[tuple[str, int]], list[str]]:
    """Samples of ``split`` (``root/train`` or ``root/<eval_dir>``), labelled by the training split's class names."""
    if split == "train":
        return scan_class_folders(root / "train")
    return scan_class_folders(root / eval_dir, classes=class_folders(root / "train"))


@register_dataset(
    "imagenet",
    description="ImageNet-1k (ILSVRC 2012): 1.28M train / 50k val images of 1000 classes, class folders",
    markers=("train", "val"),
    system_paths=("/usr/share/datasets/imagenet",),
    get="ImageNet cannot be downloaded automatically (licence); see `kdcollapse data download imagenet`.",
)
def imagenet(root: Path, split: str) -> FolderDataset:
    """``train/<wnid>/*.JPEG`` and ``val/<wnid>/*.JPEG``; training: random-resized crop 224 + flip,
    evaluation: resize 256 + centre crop 224; ImageNet mean/std."""
    samples, classes = _split_classes(root, split, "val")
    return FolderDataset(
        samples, classes, IMAGENET_MEAN, IMAGENET_STD, "imagenet", image_size=224, resize=256,
        random_resized_crop=True, default_augment=Augment(flip=True),
    )  # fmt: skip


@register_dataset(
    "image_folder",
    description="any <root>/train/<class>/<image> and <root>/{test,val}/<class>/<image> tree (root required)",
    get="Pass root=DIR (CLI: --root DIR) pointing at a folder with train/ and test/ (or val/).",
)
def image_folder(
    root: Path | None, split: str, image_size: int = 224, resize: int | None = None,
    random_resized_crop: bool = True, mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
) -> FolderDataset:  # fmt: skip
    """A generic class-folder tree; defaults follow ImageNet (``resize`` defaults to ``image_size * 8/7``)."""
    if root is None:
        raise DataError("dataset 'image_folder' needs root=DIR (a folder with train/ and test/ or val/)")
    resize = resize or round(image_size * 8 / 7)
    if resize < image_size:
        raise DataError(f"image_folder: resize ({resize}) must be >= image_size ({image_size})")
    root = Path(root)
    samples, classes = _split_classes(root, split, "test" if (root / "test").is_dir() else "val")
    return FolderDataset(
        samples, classes, tuple(mean), tuple(std), "image_folder", image_size=image_size,
        resize=resize, random_resized_crop=random_resized_crop,
        default_augment=Augment(flip=True),
    )  # fmt: skip


def _tiny_dir(root: Path) -> Path:
    return root if (root / "wnids.txt").is_file() else root / "tiny-imagenet-200"


@register_dataset(
    "tiny_imagenet",
    description="Tiny-ImageNet-200: 100k train / 10k val 64x64 images of 200 classes",
    markers=("tiny-imagenet-200/wnids.txt", "wnids.txt"),
    get="Get it with `kdcollapse data download tiny_imagenet`.",
)
def tiny_imagenet(root: Path, split: str) -> FolderDataset:
    """``tiny-imagenet-200/train/<wnid>/images/*.JPEG``; the test split is ``val/images`` labelled by
    ``val/val_annotations.txt``. Training: random crop 64 with padding 4 + flip (on the device).
    Mean (0.4802, 0.4481, 0.3975), std (0.2770, 0.2691, 0.2821), the commonly used train-set values."""
    base = _tiny_dir(root)
    wnids_file = base / "wnids.txt"
    classes = sorted(wnids_file.read_text().split())
    if len(classes) == 0:
        raise DataError(f"{wnids_file}: no class ids")
    index = {wnid: i for i, wnid in enumerate(classes)}
    if split == "train":
        samples, found = scan_class_folders(base / "train", inner="images")
        if found != classes:
            raise DataError(f"{base / 'train'}: class folders differ from {wnids_file}")
    else:
        samples = _tiny_val_samples(base / "val", index)
    return FolderDataset(
        samples, classes, (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821), "tiny_imagenet",
        image_size=64, resize=64, default_augment=Augment(crop_padding=4, flip=True),
    )  # fmt: skip


def _tiny_val_samples(val_dir: Path, index: dict[str, int]) -> list[tuple[str, int]]:
    annotations = val_dir / "val_annotations.txt"
    if not annotations.is_file():
        raise DataError(f"{annotations}: missing (it maps each val image to its class)")
    samples = []
    for line_no, line in enumerate(annotations.read_text().splitlines(), 1):
        fields = line.split("\t")
        if not line.strip():
            continue
        if len(fields) < 2 or fields[1] not in index:
            raise DataError(
                f"{annotations}:{line_no}: expected 'IMAGE<TAB>WNID...' with a known wnid, got {line!r}"
            )
        path = val_dir / "images" / fields[0]
        if not path.is_file():
            raise DataError(f"{annotations}:{line_no}: image {path} does not exist")
        samples.append((str(path), index[fields[1]]))
    return sorted(samples)
