"""YAML for input people hand us (matrix files, --set values, values/<shape>.yaml), read so that
no input can hang, exhaust memory or end in a traceback: every problem is one ValueError line.

yaml.safe_load keeps anchors shared, but everything after it copies (dataclasses.asdict, JSON,
the run specs), so a 1 KB "billion laughs" file became gigabytes. Here the document is composed
first and its node graph walked with aliases expanded: more than MAX_NODES nodes, more than
MAX_DEPTH levels, or an alias that contains itself is refused before anything is built. NUL
bytes (raw, or "\\0" escapes that would reach a path) are refused too.
"""
from __future__ import annotations

from typing import Any

import yaml

MAX_NODES = 10_000
"""Nodes of the document with every alias expanded (the default matrix has about 60)."""
MAX_DEPTH = 32
"""Nesting levels (a matrix is three deep)."""
MAX_DIGITS = 100
"""Digits of an integer (a knob's largest bound has 10); Python refuses over 4,300 with a
traceback-worthy message that names neither the file nor the key."""


class _Refused(Exception):
    pass


def _walk(node: yaml.Node) -> None:
    """Count the expanded nodes and the depth; a node met again on its own path is a cycle."""
    count, path, seen, aliased = 0, list[yaml.Node](), set[int](), False

    def visit(n: yaml.Node, key: str) -> None:
        nonlocal count, aliased
        count += 1
        aliased = aliased or id(n) in seen  # the same node twice: an alias (*name) brought it again
        seen.add(id(n))
        if count > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} values once its aliases (*name) are expanded: write the values "
                           "out, without aliases" if aliased else
                           f"more than {MAX_NODES} values{' under ' + key if key else ''}: a matrix needs tens; "
                           "split the sweep into several matrices")
        if any(n is p for p in path):
            raise _Refused("an alias refers to the anchor that contains it (a value that contains itself)")
        if len(path) >= MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(n, yaml.ScalarNode) and n.tag == "tag:yaml.org,2002:int" and len(n.value) > MAX_DIGITS:
            raise _Refused(f"{key or 'a value'} on line {n.start_mark.line + 1} is an integer of {len(n.value)} "
                           f"characters: no setting takes more than {MAX_DIGITS} digits")
        path.append(n)
        if isinstance(n, yaml.SequenceNode):
            for child in n.value:
                visit(child, key)
        elif isinstance(n, yaml.MappingNode):
            for k, value in n.value:
                visit(k, key)
                name = str(k.value)[:80] if isinstance(k, yaml.ScalarNode) else "a key"
                visit(value, f"{key}.{name}" if key else name)
        path.pop()

    visit(node, "")


def _no_nul(data: Any, where: str = "") -> None:
    if isinstance(data, str) and "\0" in data:
        raise _Refused(f"a NUL byte in the value{' of ' + where if where else ''}: remove it")
    if isinstance(data, dict):
        for key, value in data.items():
            _no_nul(key, where)
            _no_nul(value, f"{where}.{key}" if where else str(key))
    elif isinstance(data, list):
        for value in data:
            _no_nul(value, where)


def load(text: str, what: str) -> Any:
    """The one document in `text`, as plain data; ValueError("<what>: ...", one line) otherwise."""
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise ValueError(f"{what}: a NUL byte on line {line}: remove it (is this a text file?)")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _walk(node)
        data = loader.construct_document(node)
        _no_nul(data)
        return data
    except _Refused as exc:
        raise ValueError(f"{what}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{what}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:  # the composer recurses once per level: deeper than Python's stack
        raise ValueError(f"{what}: nested more than {MAX_DEPTH} levels deep") from None
    finally:
        loader.dispose()
