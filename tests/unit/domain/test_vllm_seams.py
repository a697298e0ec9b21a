"""The seam canary on small sources: each kind of seam found, each kind of move named."""

from __future__ import annotations

from graph_kvcache_mcp.domain.vllm.seams import FieldOrder, Literal, Seam, check_seams

SOURCE = """
from x import Imported

class Output:
    field_a: int
    field_b: str = ""

    def method(self) -> None:
        self.set_in_method = 1

class Events:
    first: int
    second: int
    third: int | None = None

def _private_helper() -> None: ...

NAME = "vllm:some_metric"
"""
M = "vllm/m.py"


def results(*checks: Seam | FieldOrder | Literal, source: str | None = SOURCE) -> list[bool]:
    return [r.found for r in check_seams({M: source}, checks)]


def test_fields_methods_self_attributes_functions_and_imports_are_found() -> None:
    checks: list[Seam | FieldOrder | Literal] = [
        Seam(M, "Output", "field_a", ""),
        Seam(M, "Output", "method", ""),
        Seam(M, "Output", "set_in_method", ""),
        Seam(M, None, "_private_helper", ""),
        Seam(M, None, "Imported", ""),
        Literal(M, "vllm:some_metric", ""),
    ]
    assert results(*checks) == [True] * len(checks)


def test_a_renamed_field_a_missing_class_and_a_missing_module_are_named() -> None:
    out = check_seams(
        {M: SOURCE, "vllm/gone.py": None},
        [
            Seam(M, "Output", "renamed", ""),
            Seam(M, "Missing", "field_a", ""),
            Seam("vllm/gone.py", None, "x", ""),
            Literal(M, "vllm:other_metric", ""),
        ],
    )
    assert [(r.found, r.detail) for r in out] == [
        (False, "not in the class"),
        (False, "class missing"),
        (False, "module missing"),
        (False, "name not registered"),
    ]


def test_field_order_accepts_fields_added_or_absent_at_the_end_but_not_inserted() -> None:
    assert results(FieldOrder(M, "Events", ("first", "second"), "")) == [True]
    assert results(FieldOrder(M, "Events", ("first", "second", "third", "fourth"), "")) == [True]
    inserted = SOURCE.replace("    second: int\n", "    inserted: int\n    second: int\n")
    assert results(FieldOrder(M, "Events", ("first", "second"), ""), source=inserted) == [False]
