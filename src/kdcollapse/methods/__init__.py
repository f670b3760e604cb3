"""Training methods, one module each, found by name: ``get_method(name)``, ``list_methods()``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kdcollapse._registry import Registry
from kdcollapse.methods._base import Equality, Method
from kdcollapse.methods._teacher import (FrozenTeacher, StoredLogits, TeacherOutput, TeacherRequest, batch_statistics,
                                         check_stored_logits, expand_logits, store_logits, top_logits)

_METHODS: Registry[type[Method]] = Registry("method")
get_method = _METHODS.get


def register_method(name: str, *, equals: Equality | None = None,
                    checks: tuple[dict[str, Any], ...] = ()) -> Callable[[type[Method]], type[Method]]:
    """Class decorator: register a :class:`Method` subclass under ``name`` and set its ``name`` and
    :attr:`~Method.equals`.

    ``equals(method, x, y)`` (``index=`` too for a method with ``needs_index``) is what the method's
    ``forward(...)["loss"]`` must equal, written as the combination of registered losses it claims to
    compute (``get_loss("kd").function`` …) over its connectors (regressors, attacks, learned
    temperatures: the method's own modules). The registry-driven contract test
    (tests/test_method_equalities.py) checks value and gradients in float64 on random inputs, so a
    method that computes something else than it declares fails; a method registered without ``equals``
    fails there too. The declaration belongs to this registration only: a subclass registered under
    another name declares its own. ``checks``: config overrides under which the contract checks the
    equality too, besides the defaults (the code paths a default leaves off, e.g. ``{"cosine_weight": 0.5}``).
    """

    def decorator(cls: type[Method]) -> type[Method]:
        cls.name = name
        cls.equals = None if equals is None else staticmethod(equals)
        cls.equality_checks = ({}, *checks)
        return _METHODS.register(name)(cls)

    return decorator


def list_methods(pattern: str = "*") -> list[str]:
    return _METHODS.names(pattern)


def build_method(config, student, *, num_classes: int, teacher: FrozenTeacher | None = None,
                 label_smoothing: float = 0.0, num_samples: int | None = None,
                 train_labels=None) -> Method:
    """Instantiate the method named by ``config.name`` around ``student``; ``num_samples``: the size of
    the training set (for a method with a memory bank over it); ``train_labels``: the (N,) labels of the
    whole training set in dataset order (the rows ``index`` names; CRD's sampler draws its negatives by them),
    which also give ``num_samples``."""
    return get_method(config.name)(student, config, num_classes=num_classes, teacher=teacher,
                                   label_smoothing=label_smoothing, num_samples=num_samples,
                                   train_labels=train_labels)


# The extension helpers of a user's method (``--import``): the face of these private modules.
from kdcollapse.methods._distill import (Distiller, check_config, softmax_request, standardized,  # noqa: E402
                                        warmup_factor)
from kdcollapse.methods._stages import StageTransfer, check_pairs, check_stages, stages  # noqa: E402

# Importing the method modules registers them.
from kdcollapse.methods import vanilla  # noqa: E402,F401
from kdcollapse.methods import ce_binarykl, dhkd, dkd, dkl_kd, dual_head_kd, ikl_kd, kd  # noqa: E402,F401
from kdcollapse.methods import ikl_at, trades  # noqa: E402,F401
from kdcollapse.methods import intra_class_teacher, rkd  # noqa: E402,F401
from kdcollapse.methods import spherical  # noqa: E402,F401
from kdcollapse.methods import ctkd, mlkd, nkd, wttm  # noqa: E402,F401
from kdcollapse.methods import crd, reviewkd, vid  # noqa: E402,F401
from kdcollapse.methods import at, dist, fitnet, nst, ofd, pkt, sp  # noqa: E402,F401
from kdcollapse.methods import srd  # noqa: E402,F401

__all__ = ["Distiller", "StageTransfer", "check_config", "check_pairs", "check_stages", "softmax_request", "stages",
           "standardized", "warmup_factor",
           "Equality", "FrozenTeacher", "Method", "StoredLogits", "TeacherOutput", "TeacherRequest", "batch_statistics", "build_method",
           "check_stored_logits", "expand_logits", "get_method", "list_methods", "register_method", "store_logits",
           "top_logits"]
