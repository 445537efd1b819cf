"""The result record's JSON Schema, generated from the dataclasses in trainer/record.py so the two
cannot drift. Tests compare it with the checked-in trainer/schema/result.schema.json; regenerate
with `python -m shardbench.trainer.record_schema > trainer/schema/result.schema.json`."""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from shardbench.trainer.fielddocs import field_docs
from shardbench.trainer.record import SCHEMA_VERSION, STATUSES, ResultRecord


def _type_schema(tp) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(a) for a in typing.get_args(tp)]}
    if tp is type(None):
        return {"type": "null"}
    if origin is list:
        return {"type": "array", "items": _type_schema(typing.get_args(tp)[0])}
    if origin is dict:
        return {"type": "object"}
    if dataclasses.is_dataclass(tp):
        return _dataclass_schema(tp)
    return {"type": {int: "integer", float: "number", str: "string", bool: "boolean"}.get(tp, "object")}


def _dataclass_schema(cls) -> dict[str, Any]:
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    props = {}
    for f in dataclasses.fields(cls):
        props[f.name] = _type_schema(hints[f.name])
        if f.name in docs:
            props[f.name]["description"] = docs[f.name]
    schema = {"type": "object", "properties": props, "required": [f.name for f in dataclasses.fields(cls)],
              "additionalProperties": False}
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
        schema["description"] = " ".join(cls.__doc__.split())
    return schema


def json_schema() -> dict[str, Any]:
    schema = _dataclass_schema(ResultRecord)
    schema["properties"]["schema_version"]["const"] = SCHEMA_VERSION
    schema["properties"]["status"]["enum"] = list(STATUSES)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"shardbench result record v{SCHEMA_VERSION}", **schema}


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2))
