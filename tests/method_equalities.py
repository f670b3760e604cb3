"""The contract that checks a method's maths: ``forward(x, y)["loss"]`` equals, in value and in the gradient
of every trainable parameter, what the method declares with ``register_method(name, equals=...)`` — the
combination of registered losses it claims to compute over its own connectors — in float64 on random
inputs, under each of its declared ``checks`` configs.

:func:`equality_failures` is the check; tests/test_method_equalities.py runs it over the registry and over
mutants (wrong methods built in the test) that it must catch.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from kdcollapse.methods import FrozenTeacher, get_method
from kdcollapse.models import create_model

K, B = 5, 10  # two samples of each class
RTOL, ATOL = 1e-7, 1e-10  # float64 student; the teacher's outputs are float32 values, the same on both sides


def tiny_model(cls, config, width: int):
    """An MLP on 8×8 inputs, or for methods reading stage maps a small CNN (stages at 8×8 too)."""
    request = cls.teacher_request(config)
    if request is not None and request.stages:
        return create_model("convnet_small", K, in_channels=1)
    return create_model("mlp", K, in_channels=1, input_size=8, hidden=(width,))


def batch(views: int, seed: int):
    """Random float64 inputs (B, [V,] 1, 8, 8), labels with every class twice, and their rows in a training set
    of 4B whose row r has label r mod K."""
    g = torch.Generator().manual_seed(seed)
    shape = (B, views, 1, 8, 8) if views > 1 else (B, 1, 8, 8)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    shift = int(torch.randint(0, 4 * B // K - B // K + 1, (), generator=g))
    return x, torch.arange(B) % K, torch.arange(B) + K * shift


def build(cls, overrides: dict):
    """The method with its default config plus ``overrides``, a float64 student and teacher, primed by one
    step and one epoch end (so class tables, memory banks and warm-up ramps hold non-trivial values)."""
    config = dataclasses.replace(cls.Config(), **overrides)
    config.name = cls.name
    torch.manual_seed(0)
    teacher = None
    if cls.teacher_request(config) is not None:
        teacher = FrozenTeacher(tiny_model(cls, config, 12).double())
        teacher.model.train(False)
    method = cls(tiny_model(cls, config, 16), config, num_classes=K, teacher=teacher,
                 train_labels=torch.arange(4 * B) % K).double()
    method.set_input_normalization((0.5,), (0.25,))
    method.train()
    method.on_epoch_start(0)
    x, y, index = batch(method.views, seed=1)
    step(method, x, y, index)
    method.on_epoch_end(0)
    method.on_epoch_start(2)  # inside the warm-up ramps of DKD and IKL (3/20)
    method.zero_grad(set_to_none=True)
    return method


def step(method, x, y, index):
    return method(x, y, index=index) if method.needs_index else method(x, y)


def _gradients(method, loss):
    params = {n: p for n, p in method.named_parameters() if p.requires_grad}
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(params.items(), grads)}


def equality_failures(name: str) -> list[str]:
    """What is wrong with registered method ``name``'s declared equality: [] when ``forward``'s loss matches
    ``equals`` in value and gradients under every config of its ``equality_checks``."""
    cls = get_method(name)
    if cls.equals is None:
        return [f"method {name!r} declares no equality: register it with register_method({name!r}, equals=f), "
                "f(method, x, y) the combination of registered losses (get_loss(...).function) over the "
                "method's connectors that forward(x, y)['loss'] computes"]
    failures = []
    for overrides in cls.equality_checks:
        method = build(cls, overrides)
        twin = copy.deepcopy(method)
        x, y, index = batch(method.views, seed=2)
        extra = {"index": index} if method.needs_index else {}
        torch.manual_seed(3)
        loss = step(method, x, y, index)["loss"]
        torch.manual_seed(3)
        expected = cls.equals(twin, x, y, **extra)
        where = f"method {name!r}" + (f" with {overrides}" if overrides else "")
        if not torch.allclose(loss, expected.to(loss.dtype), rtol=RTOL, atol=ATOL):
            failures.append(f"{where}: loss {loss.item():.10g}, its declared equality {expected.item():.10g}")
            continue
        got, want = _gradients(method, loss), _gradients(twin, expected)
        wrong = [n for n in got if not torch.allclose(got[n], want[n], rtol=RTOL, atol=ATOL)]
        if wrong:
            failures.append(f"{where}: the gradients of {', '.join(wrong)} differ from the declared equality's")
    return failures
