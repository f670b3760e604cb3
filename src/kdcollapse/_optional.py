"""Optional dependencies: plotting (matplotlib) and t-SNE / the digits dataset (scikit-learn).

``pip install kdcollapse`` installs what the losses, metrics, models, methods and trainer need;
``pip install 'kdcollapse[analysis]'`` adds these, ``kdcollapse[all]`` everything. A module that uses
one imports it on first use, so the rest of the package works without it, and a missing one is a
``KdcollapseError`` that says what to install.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType

from kdcollapse.errors import KdcollapseError

EXTRAS = {"matplotlib": "analysis", "sklearn": "analysis", "tensorboard": "tensorboard", "submitit": "slurm", "wandb": "tracking",
          "mlflow": "tracking", "transformers": "llm", "accelerate": "llm", "gguf": "llm", "datasets": "llm",
          "peft": "peft"}
_PIP_NAMES = {"sklearn": "scikit-learn"}


def require(name: str, purpose: str) -> ModuleType:
    """``import name``, or a ``KdcollapseError`` naming the package and the extra that installs it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        top = name.partition(".")[0]
        package = _PIP_NAMES.get(top, top)
        raise KdcollapseError(
            f"{purpose} needs {package}, which is not installed: pip install 'kdcollapse[{EXTRAS.get(top, 'all')}]' "
            f"(or pip install {package})"
        ) from None


def available(name: str) -> bool:
    """Whether ``import name`` would find the module (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def install_hint(name: str) -> str:
    """``pip install 'kdcollapse[EXTRA]'`` for the optional module ``name``."""
    return f"pip install 'kdcollapse[{EXTRAS.get(name.partition('.')[0], 'all')}]'"


class OptionalModule:
    """Stands for module ``name``, imported (after ``before()``) on first attribute access."""

    def __init__(self, name: str, purpose: str, before: Callable[[], None] | None = None):
        self._name, self._purpose, self._before, self._module = name, purpose, before, None

    def __getattr__(self, attr: str):
        if self._module is None:
            if self._before is not None:
                self._before()
            self._module = require(self._name, self._purpose)
        return getattr(self._module, attr)


def _agg_backend() -> None:
    require("matplotlib", "plotting").use("Agg")


pyplot = OptionalModule("matplotlib.pyplot", "plotting", before=_agg_backend)
ticker = OptionalModule("matplotlib.ticker", "plotting", before=_agg_backend)
