"""Tool schemas as a model and a client need them: `lean_schema` for a tool's input (no titles,
no null branch for an optional argument, definitions used once written in place) and
`lean_output_schema` for its output (no titles, definitions in place, a nullable plain type as
one `type` list).

Pure: dicts in, dicts out. `strict_server.tighten` applies both to every tool it registers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

SchemaChange = Callable[[dict[str, Any]], dict[str, Any]]

# Keywords whose value is a schema, a list of schemas, or a map of name -> schema.
_ONE_SCHEMA = ("items", "additionalProperties", "not", "contains", "if", "then", "else")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "patternProperties", "dependentSchemas")
_NULL = {"type": "null"}
_DEFS = "#/$defs/"


def lean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as a model needs it: every `title` keyword dropped (a property *named* title
    stays), no class docstrings on `$defs`, an optional value whose default is null shown as its
    plain type (omitting it means null; a null sent anyway is still accepted), and a definition
    used once written in place (hosts resolve inline schemas most reliably)."""
    return _inline_single_use_defs(_lean(schema))


def _lean(schema: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in schema.items() if key != "title"}
    if "$defs" in out:
        # A definition's description is its class docstring: written for code readers, and the
        # properties that use it carry their own descriptions.
        out["$defs"] = {
            name: {k: v for k, v in sub.items() if k != "description"}
            for name, sub in out["$defs"].items()
        }
    if "default" in out and out["default"] is None and _is_nullable(out.get("anyOf")):
        (kept,) = [sub for sub in out.pop("anyOf") if sub != _NULL]
        del out["default"]
        out = {**kept, **out}
    for key in _ONE_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = _lean(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_lean(sub) for sub in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _lean(sub) for name, sub in out[key].items()}
    return out


def _inline_single_use_defs(schema: dict[str, Any]) -> dict[str, Any]:
    defs: dict[str, Any] = schema.get("$defs") or {}
    uses = Counter(_refs(schema))
    once = {name for name in defs if uses[f"{_DEFS}{name}"] == 1}

    def resolve(node: Any, inside: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [resolve(sub, inside) for sub in node]
        if not isinstance(node, dict):
            return node
        name = str(node.get("$ref", "")).removeprefix(_DEFS)
        if name in once and name not in inside:  # `inside` stops a definition that nests itself
            rest = {key: resolve(value, inside) for key, value in node.items() if key != "$ref"}
            return {**resolve(defs[name], inside | {name}), **rest}
        return {key: resolve(value, inside) for key, value in node.items()}

    out = resolve({key: value for key, value in schema.items() if key != "$defs"}, frozenset())
    kept = {name: resolve(sub, frozenset({name})) for name, sub in defs.items() if name not in once}
    return {**out, "$defs": kept} if kept else out


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [ref for sub in node for ref in _refs(sub)]
    if not isinstance(node, dict):
        return []
    own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
    return own + [ref for value in node.values() for ref in _refs(value)]


def _is_nullable(options: object) -> bool:
    return isinstance(options, list) and len(options) == 2 and _NULL in options


def lean_output_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (a tool's output) with every `title` dropped, definitions used once written in
    place, and a nullable plain type (`anyOf: [{type: T}, {type: null}]`) written as
    `type: [T, "null"]`: the same values valid, about half the work for a client that checks
    every result against it (the SDK's jsonschema check walks each `anyOf` branch and `$ref`).
    Null branches stay: unlike an omitted argument, a result's null is a value it sends."""
    return _inline_single_use_defs(_nullable_as_type_list(_untitled(schema)))


def _untitled(node: Any) -> Any:
    return _rewrite(node, lambda out: {k: v for k, v in out.items() if k != "title"})


def _nullable_as_type_list(node: Any) -> Any:
    def merge(out: dict[str, Any]) -> dict[str, Any]:
        options = out.get("anyOf")
        if not isinstance(options, list) or not _is_nullable(options):
            return out
        (kept,) = [sub for sub in options if sub != _NULL]
        if set(kept) != {"type"} or not isinstance(kept["type"], str):
            return out  # a branch with more than a type (a $ref, bounds) keeps its anyOf
        rest = {key: value for key, value in out.items() if key != "anyOf"}
        return {"type": [kept["type"], "null"], **rest}

    return _rewrite(node, merge)


def _rewrite(node: Any, change: SchemaChange) -> Any:
    """`node` with `change` applied to every schema in it, innermost first."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _ONE_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = _rewrite(out[key], change)
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_rewrite(sub, change) for sub in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _rewrite(sub, change) for name, sub in out[key].items()}
    return change(out)
