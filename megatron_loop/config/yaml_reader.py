"""Reading a config's YAML (the file and every ``--set`` value): plain data, or one error naming the key.

PyYAML's safe loader (YAML 1.1) accepts more than a config can mean, and some of it would hang,
crash later or change a value silently. This reader is the safe loader, except:

* a key given twice in one mapping is an error (PyYAML keeps the last silently, so an edit lower
  in the file would override one higher up); keys are names: a complex key (``? [a, b]``) or a
  key YAML reads as a number, boolean or null is refused;
* merge keys (``<<: *defaults``) are supported, as YAML 1.1 defines them: the mapping's own keys
  override the merged ones;
* aliases may share values, but a document whose aliases expand it to more than
  :data:`MAX_VALUES` values (a "billion laughs" document: nine nested aliases of nine make 9^10)
  or that contains itself (``model: &a {self: *a}``) is refused before it is expanded;
* YAML 1.1's implicit dates (``2024-01-01``) and base-60 numbers (``1:30`` read as 90) are read
  as strings, so the typed check names the key and the type it expected;
* explicit tags that build something other than plain data (``!!binary``, ``!!timestamp``,
  ``!!set``, ``!!omap``, ``!!pairs``) are refused naming the key.

What comes back is built of dicts with string keys, lists, strings, numbers, booleans and None.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

import yaml

from megatron_loop.errors import LoopConfigError

# A config holds a few hundred values; aliases may share some, but an expansion past this is an
# alias bomb (each level multiplies the size), refused before anything is built from it.
MAX_VALUES = 100_000

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"
# YAML 1.1's int and float patterns (yaml/resolver.py) without the base-60 forms (``1:30``).
_INT_RE = re.compile(r"""^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+)$""", re.X)
_FLOAT_RE = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X)
# What an explicit tag builds that is not plain data, and how the message names it.
_NOT_PLAIN = ((bytes, "!!binary"), (datetime.date, "!!timestamp"), (set, "!!set"), (tuple, "!!omap or !!pairs"))


class ConfigLoader(yaml.SafeLoader):
    """The safe loader with the rules of the module docstring (use :func:`read_yaml`)."""

    def construct_mapping(self, node, deep=False):
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        seen: dict = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE:  # ``<<:`` (SafeConstructor.flatten_mapping merges it below)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise LoopConfigError(f"a complex key (a {'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'}) "
                                      f"at line {line}; expected a name")
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                raise LoopConfigError(f"key {key_node.value!r} at line {line} reads as a {type(key).__name__} in "
                                      "YAML; expected a name (quote it)")
            if key in seen:
                raise LoopConfigError(f"duplicate key {key!r} at line {line} (first at line {seen[key]}); "
                                      "expected each key once in a mapping")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT, _TIMESTAMP)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ConfigLoader.add_implicit_resolver(_INT, _INT_RE, list("-+0123456789"))
ConfigLoader.add_implicit_resolver(_FLOAT, _FLOAT_RE, list("-+0123456789."))


def _where(path: list[str]) -> str:
    return ".".join(path) or "the document"


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph that contains itself or expands past :data:`MAX_VALUES` values, by
    counting each shared node once per use without expanding it (memoised by node)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node, path: list[str]) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise LoopConfigError(f"{_where(path)}: an alias to a value that contains it (line "
                                  f"{node.start_mark.line + 1}, a recursive alias); expected a value that "
                                  "does not contain itself")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child, [*path[:-1], f"{path[-1] if path else ''}[{i}]"])
                         for i, child in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                name = k.value if isinstance(k, yaml.ScalarNode) else "?"
                total += size(k, path) + size(v, [*path, str(name)])
        if total > MAX_VALUES:
            raise LoopConfigError(f"{_where(path)}: its aliases expand it to more than {MAX_VALUES:,} values (line "
                                  f"{node.start_mark.line + 1}; nested aliases multiply, a 'billion laughs' "
                                  "document); expected a config of plain values")
        open_nodes.discard(key)
        sizes[key] = total
        return total

    try:
        size(root, [])
    except RecursionError:
        raise LoopConfigError("the document nests deeper than Python's recursion limit; expected a config of "
                              "a few levels") from None


def _check_plain(value: Any, path: list[str]) -> None:
    """Every value is plain data; one built by an explicit tag is refused naming its key."""
    for kind, tag in _NOT_PLAIN:
        if isinstance(value, kind):
            raise LoopConfigError(f"{_where(path)}: a YAML {tag} value; expected a string, number, boolean, "
                                  "list or mapping")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_plain(v, [*path, k])
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_plain(v, [*path[:-1], f"{path[-1] if path else ''}[{i}]"])


def read_yaml(text: str, path: list[str] | None = None) -> Any:
    """``text`` parsed by :class:`ConfigLoader` into plain data; ``path`` is the key it is the value
    of (a ``--set`` value), for messages. Raises :class:`LoopConfigError` for the refusals of the
    module docstring and ``yaml.YAMLError`` for text that is not YAML."""
    path = list(path or [])
    loader = ConfigLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        try:
            value = loader.construct_document(node)
        except RecursionError:
            raise LoopConfigError("the document nests deeper than Python's recursion limit; expected a config "
                                  "of a few levels") from None
    finally:
        loader.dispose()
    _check_plain(value, path)
    return value


def yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's message on one line: the problem and where (its own text spans several lines)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem
