"""`lean_output_schema`: a smaller output schema that accepts exactly what the SDK's did."""

from __future__ import annotations

from typing import Any

from jsonschema.validators import validator_for  # type: ignore[import-untyped]
from pydantic import BaseModel, Field

from graph_kvcache_mcp.host.tool_schemas import lean_output_schema


class Item(BaseModel):
    """A class docstring."""

    title: str = Field(description="A property named title stays.")
    size: int | None = None


class Outer(BaseModel):
    items: list[Item]
    best: Item | None = None
    note: str | None = Field(default=None, description="Why.")
    bound: int | None = Field(default=None, ge=0)


def _sdk_schema() -> dict[str, Any]:
    return Outer.model_json_schema(mode="serialization")


def test_titles_go_and_a_nullable_plain_type_becomes_one_type_list() -> None:
    lean = lean_output_schema(_sdk_schema())
    assert lean["properties"]["note"] == {
        "type": ["string", "null"],
        "default": None,
        "description": "Why.",
    }
    item = lean["$defs"]["Item"]  # used twice: stays a definition
    assert "title" in item["properties"] and "title" not in item["properties"]["title"]
    assert item["properties"]["size"] == {"type": ["integer", "null"], "default": None}
    # a branch with more than a type (bounds) keeps its anyOf, and so does a nullable $ref
    assert "anyOf" in lean["properties"]["bound"]
    assert "anyOf" in lean["properties"]["best"]
    assert "title" not in lean


def test_the_lean_schema_accepts_and_refuses_the_same_values() -> None:
    sdk, lean = _sdk_schema(), lean_output_schema(_sdk_schema())
    values: list[Any] = [
        {"items": []},
        {"items": [{"title": "a", "size": None}], "note": None, "bound": 3},
        {"items": [{"title": "a", "size": 1}], "best": {"title": "b"}, "note": "x"},
        {"items": [{"title": 1}]},
        {"items": [{"title": "a", "size": "1"}]},
        {"items": [], "note": 5},
        {"items": [], "bound": -1},
        {"items": [], "best": 1},
        {"note": "x"},
    ]
    for value in values:
        expected = validator_for(sdk)(sdk).is_valid(value)
        assert validator_for(lean)(lean).is_valid(value) is expected, value
    assert sum(validator_for(lean)(lean).is_valid(v) for v in values) == 3
