"""Training methods, one module each, found by name: ``get_method(name)``, ``list_methods()``."""

from __future__ import annotations

from collections.abc import Callable

from kdcollapse._registry import Registry
from kdcollapse.methods._base import Method
from kdcollapse.methods._teacher import (FrozenTeacher, StoredLogits, TeacherOutput, TeacherRequest, batch_statistics,
                                         check_stored_logits, expand_logits, store_logits, top_logits)

_METHODS: Registry[type[Method]] = Registry("method")
get_method = _METHODS.get


def register_method(name: str) -> Callable[[type[Method]], type[Method]]:
    """Class decorator: register a :class:`Method` subclass under ``name`` and set its ``name``."""

    def decorator(cls: type[Method]) -> type[Method]:
        cls.name = name
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

__all__ = ["FrozenTeacher", "Method", "StoredLogits", "TeacherOutput", "TeacherRequest", "batch_statistics", "build_method",
           "check_stored_logits", "expand_logits", "get_method", "list_methods", "register_method", "store_logits",
           "top_logits"]
