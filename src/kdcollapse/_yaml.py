"""YAML as data: ``safe_load`` (no Python objects), duplicate keys refused, every failure one ``ConfigError`` line.

Every YAML the package reads from the user or from a run directory (configs, ``key=value`` values, study and
token-report specs, ``--model-kwargs``) goes through :func:`load_yaml`: PyYAML's ``safe_load`` alone keeps the
last of two equal keys silently and ends a document nested thousands deep in a ``RecursionError``.
"""

from __future__ import annotations

from typing import Any

import yaml

from kdcollapse.errors import ConfigError

# Deeper than any config; a bound well inside Python's recursion limit (the composer recurses per level).
MAX_DEPTH = 100


class _StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *base" may be overridden key by key
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeLoader's own error below names it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def load_yaml(text: str, source: str) -> Any:
    """The data of YAML ``text``; a ``ConfigError`` of one line naming ``source`` and the problem otherwise.

    >>> load_yaml("a: 1\\nb: [2, 3]", "x.yaml")
    {'a': 1, 'b': [2, 3]}
    >>> load_yaml("lr: 0.1\\nlr: 0.2", "x.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    kdcollapse.errors.ConfigError: x.yaml is not valid YAML: duplicate key 'lr' in "<unicode string>", line 2, ...
    """
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 -- a SafeLoader subclass
    except yaml.YAMLError as err:  # its message spans lines: keep the error on one
        raise ConfigError(f"{source} is not valid YAML: {' '.join(str(err).split())}") from None
    except RecursionError:
        raise ConfigError(f"{source} is not valid YAML: nested too deeply") from None
