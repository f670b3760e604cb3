"""LoRA students of ``kdcollapse distill-lm`` (``student.lora``), through ``peft`` (the ``peft`` extra).

``student.lora: {r, alpha, dropout, target_modules, modules_to_save}`` on any student wraps it with
``peft.get_peft_model``: the student's own weights are frozen and only the adapter (and the modules named in
``modules_to_save``, e.g. ``[lm_head]``) is trained, given to the optimizer and written to
``checkpoint.safetensors``. A resume rebuilds the frozen base (it is a function of the config: the seed, or
the teacher it was initialised from), checks it against the SHA-256 stored in the checkpoint, and loads the
trained tensors bit for bit. On export the adapter is merged into the base weights (``merge_and_unload`` of a
copy), so ``student/`` is a plain Hugging Face directory.
"""

from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass, field

import torch

from kdcollapse._optional import require
from kdcollapse.errors import CheckpointError, ConfigError

LORA_KEYS = ("r", "alpha", "dropout", "target_modules", "modules_to_save")


@dataclass(frozen=True)
class LoraSection:
    """``student.lora``: rank, scale numerator (the update is ``alpha / r · B A``), dropout on the adapter's
    input, the module names (or ``all-linear``: every linear layer but the output head) and the modules
    trained in full beside the adapter."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"
    modules_to_save: list[str] = field(default_factory=list)


def lora_section(value) -> LoraSection | None:
    """``student.lora`` checked (``None`` when absent); every bad value is one ``ConfigError`` line."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"student.lora must be a mapping with keys {', '.join(LORA_KEYS)}; got {value!r}")
    unknown = sorted(set(value) - set(LORA_KEYS))
    if unknown:
        raise ConfigError(f"unknown key student.lora.{unknown[0]}; valid keys: {', '.join(LORA_KEYS)}")
    section = LoraSection(**value)
    if not (isinstance(section.r, int) and not isinstance(section.r, bool) and section.r >= 1):
        raise ConfigError(f"student.lora.r must be a positive int, got {section.r!r}")
    if not (isinstance(section.alpha, (int, float)) and not isinstance(section.alpha, bool)
            and math.isfinite(section.alpha) and section.alpha > 0):
        raise ConfigError(f"student.lora.alpha must be a finite number > 0, got {section.alpha!r}")
    if not (isinstance(section.dropout, (int, float)) and not isinstance(section.dropout, bool)
            and 0 <= section.dropout < 1):
        raise ConfigError(f"student.lora.dropout must be a number in [0, 1), got {section.dropout!r}")
    names = section.target_modules
    if not (names == "all-linear" or (isinstance(names, list) and names and all(isinstance(n, str) and n for n in names))):
        raise ConfigError(f"student.lora.target_modules must be all-linear or a non-empty list of module names, "
                          f"got {names!r}")
    if not (isinstance(section.modules_to_save, list) and all(isinstance(n, str) and n for n in section.modules_to_save)):
        raise ConfigError(f"student.lora.modules_to_save must be a list of module names, got {section.modules_to_save!r}")
    return section


def split_student(student: dict) -> tuple[dict, LoraSection | None]:
    """The student's model config without ``lora``, and its checked ``lora`` section."""
    return {k: v for k, v in student.items() if k != "lora"}, lora_section(student.get("lora"))


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the model's linear layers (what ``target_modules`` can name)."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear)})


def check_targets(model: torch.nn.Module, section: LoraSection) -> None:
    """Every module that ``section`` names exists in ``model`` (else one ``ConfigError`` naming the valid ones)."""
    valid = linear_names(model)
    bad = [n for n in ([] if section.target_modules == "all-linear" else section.target_modules) if n not in valid]
    bad += [n for n in section.modules_to_save if n not in {k.rsplit(".", 1)[-1] for k, _ in model.named_modules()}]
    if bad:
        raise ConfigError(f"student.lora: this student has no module {bad[0]!r}; its linear layers are "
                          f"{', '.join(valid)}")


def check_lora_targets(architecture, section: LoraSection) -> None:  # architecture: a transformers config or None
    """:func:`check_targets` on a weightless copy of the student (a ``transformers`` config, built on the meta
    device: no memory, no initialisation), before anything loads."""
    import transformers

    require("peft", "student.lora (a LoRA student)")
    if architecture is None:  # a student built from the teacher: checked when it is built
        return
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(architecture)
    check_targets(model, section)


class LoraStudent:
    """A student wrapped with a LoRA adapter. :attr:`model` is the student itself (its linear layers
    replaced in place by ``peft``'s LoRA layers), what the loop trains; :attr:`peft_model` the ``PeftModel``."""

    def __init__(self, model: torch.nn.Module, section: LoraSection):
        peft = require("peft", "student.lora (a LoRA student)")
        self.base_digest = frozen_digest(model)  # before peft: the base weights the adapter sits on
        config = peft.LoraConfig(r=section.r, lora_alpha=section.alpha, lora_dropout=section.dropout,
                                 target_modules=section.target_modules,
                                 modules_to_save=section.modules_to_save or None, bias="none")
        check_targets(model, section)
        self.peft_model = peft.get_peft_model(model, config)
        self.model = self.peft_model.get_base_model()

    def trained(self) -> dict[str, torch.Tensor]:
        """The trained tensors (adapter and ``modules_to_save``), by parameter name: what is checkpointed."""
        return {name: p for name, p in self.model.named_parameters() if p.requires_grad}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in self.trained().items()}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict, path: str) -> None:
        if meta.get("student_base") != self.base_digest:
            raise CheckpointError(f"cannot resume: the LoRA adapter in {path} was trained on other base weights "
                                  "(the frozen student's SHA-256 differs: another seed, student or teacher)")
        trained = self.trained()
        if set(tensors) != set(trained):
            missing = sorted(set(trained) - set(tensors)) or sorted(set(tensors) - set(trained))
            raise CheckpointError(f"{path}: its LoRA tensors do not fit this student (e.g. {missing[0]}); was "
                                  "student.lora changed?")
        with torch.no_grad():
            for name, p in trained.items():
                if tensors[name].shape != p.shape:
                    raise CheckpointError(f"{path}: {name} has shape {tuple(tensors[name].shape)}, this student's "
                                          f"{tuple(p.shape)}; was student.lora.r changed?")
                p.copy_(tensors[name])

    def merged(self) -> torch.nn.Module:
        """A copy of the student with the adapter merged into its weights: a plain ``transformers`` model."""
        return copy.deepcopy(self.peft_model).merge_and_unload()


def frozen_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the model's parameters (names, dtypes, shapes and bytes), in name order."""
    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(f"{name}:{p.dtype}:{tuple(p.shape)}".encode())
        digest.update(p.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
