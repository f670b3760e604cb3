"""The method contract: everything the trainer and ``Run`` use on a method is declared, with a docstring,
on ``kdcollapse.methods.Method`` — checked on the source, so a new undeclared hook fails here."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from torch import nn

from kdcollapse.config import method_config
from kdcollapse.methods import Method, TeacherRequest, get_method, list_methods

SRC = Path(__file__).resolve().parents[1] / "src" / "kdcollapse"
USERS = {"train/_trainer.py": {"method", "method_cls"}, "train/_checkpointer.py": {"method"},
         "runs/_run.py": {"method", "method_cls"}}


def _declared_docs() -> dict[str, str | None]:
    """Name -> docstring of every attribute and method declared in ``Method``'s class body."""
    body = next(n for n in ast.parse((SRC / "methods/_base.py").read_text()).body
                if isinstance(n, ast.ClassDef) and n.name == "Method").body
    docs: dict[str, str | None] = {}
    for node, after in zip(body, [*body[1:], None]):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            docs[node.name] = ast.get_docstring(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            is_doc = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            docs[node.target.id] = after.value.value if is_doc else None
    return docs


def _used_names(path: str, variables: set[str]) -> set[str]:
    """Attributes read on ``<var>.x`` / ``self.<var>.x`` in a module, and any getattr/hasattr on them."""
    used = set()
    for node in ast.walk(ast.parse((SRC / path).read_text())):
        if isinstance(node, ast.Attribute):
            base = node.value
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
            if isinstance(base, ast.Call) and getattr(base.func, "id", None) == "get_method":
                name = "method_cls"  # get_method(...).attribute
            if name in variables:
                used.add(node.attr)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr"):
            target = ast.unparse(node.args[0])
            assert target.split(".")[-1] not in variables, f"{path}: {ast.unparse(node)} reads an undeclared hook"
    return used


@pytest.mark.parametrize("path", sorted(USERS))
def test_every_name_used_on_a_method_is_declared_with_a_docstring(path):
    declared = _declared_docs()
    module_api = set(dir(nn.Module))
    used = _used_names(path, USERS[path]) - module_api - {"name"}  # cfg.method.name is the config's
    assert used, path
    for name in used:
        assert name in declared, f"{path} uses method.{name}, which Method does not declare"
        assert declared[name], f"Method.{name} has no docstring"


def test_the_trainer_hooks_are_all_declared():
    hooks = {"forward", "backward", "after_step", "predict", "inference_model", "set_input_normalization",
             "on_epoch_start", "on_epoch_end", "epoch_metrics", "extra_state", "load_extra_state",
             "teacher_request", "needs_index", "optimizer_groups", "views", "manual_gradient_sync", "extra_heads",
             "student", "name", "Config"}
    docs = _declared_docs()
    assert hooks <= set(docs) and all(docs[h] for h in hooks), {h for h in hooks if not docs.get(h)}


@pytest.mark.parametrize("name", list_methods())
def test_registered_methods_fill_the_class_attributes(name):
    cls = get_method(name)
    assert cls.name == name
    request = cls.teacher_request(method_config({"name": name}))
    assert request is None or isinstance(request, TeacherRequest)
    assert isinstance(cls.needs_index, bool) and isinstance(cls.manual_gradient_sync, bool)
    assert isinstance(cls.views, int) and cls.views >= 1
    assert all(isinstance(label, str) and isinstance(attr, str) for label, attr in cls.extra_heads.items())
    assert inspect.isclass(cls.Config)
    assert cls.forward is not Method.forward, f"{name} must implement forward"


DOCS = {path.name: path.read_text() for path in (SRC.parents[1] / "docs").glob("*.md")}


@pytest.mark.parametrize("name", [n for n in list_methods() if get_method(n).__module__.startswith("kdcollapse.methods.")])
def test_every_method_is_documented(name):
    """A method, like a loss, is named on a docs page (its formula, parts and defaults: distillation.md or its
    topic's page)."""
    assert any(f"`{name}`" in text for text in DOCS.values()), f"document method {name!r} in docs/ (e.g. distillation.md)"
