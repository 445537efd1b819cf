"""Field docstrings of a dataclass: the string literal right below each field, read from the
source. The trainer's --help, the record's JSON Schema and the suite's flag help all use them,
so each field is documented once, where it is declared."""
from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache


@cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring, white space folded}."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs
