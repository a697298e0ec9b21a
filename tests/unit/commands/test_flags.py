"""Flags derived from model fields and shared bounded types: name, default, help, choices, and
the declared bound checked as argparse reads the value."""

from __future__ import annotations

import argparse
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from graph_kvcache_mcp.commands._flags import add_flag, add_model_flags, model_from_args
from graph_kvcache_mcp.domain.lifecycle import ServicePort, StopWait
from graph_kvcache_mcp.errors import ConfigError


class Example(BaseModel):
    name: str = Field(min_length=1, description="What it is called.")
    port: ServicePort | None = Field(None, description="Where it listens.")
    mode: Literal["fast", "safe"] = "safe"
    verbose: bool = False
    ratio: float = Field(0.5, ge=0, le=1)
    low: int = 1
    high: int = 2


def parser_for(**kwargs: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="example", exit_on_error=False)
    add_model_flags(parser, Example, ("name", "port", "mode", "verbose", "ratio"), **kwargs)  # type: ignore[arg-type]
    return parser


def test_model_flags_carry_the_fields_defaults_help_and_choices() -> None:
    parser = parser_for()
    args = parser.parse_args(["--name", "x"])
    assert (args.name, args.port, args.mode, args.verbose, args.ratio) == (
        "x",
        None,
        "safe",
        False,
        0.5,
    )
    args = parser.parse_args(["--name", "x", "--port", "8123", "--mode", "fast", "--verbose"])
    assert (args.port, args.mode, args.verbose) == (8123, "fast", True)
    text = parser.format_help()
    assert "What it is called." in text and "{fast,safe}" in text


def test_a_required_field_is_a_required_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parser_for().parse_args([])
    assert exited.value.code == 2
    assert "the following arguments are required: --name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "80"], "argument --port: Input should be greater than or equal to 1024"),
        (
            ["--port", "x"],
            "argument --port: Input should be a valid integer, unable to parse string as an "
            "integer",
        ),
        (["--ratio", "1.5"], "argument --ratio: Input should be less than or equal to 1"),
        (["--name", ""], "argument --name: String should have at least 1 character"),
        (["--mode", "slow"], "argument --mode: Input should be 'fast' or 'safe'"),
    ],
)
def test_a_value_outside_the_declared_bound_names_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(argparse.ArgumentError) as refused:
        parser_for().parse_args(["--name", "x", *argv] if argv[0] != "--name" else argv)
    assert str(refused.value) == message


def test_overrides_rename_a_flag_change_its_default_and_help() -> None:
    parser = parser_for(flags={"port": "--listen"}, defaults={"mode": "fast"}, helps={"port": "P!"})
    args = parser.parse_args(["--name", "x", "--listen", "9000"])
    assert (args.port, args.mode) == (9000, "fast")
    assert "P!" in parser.format_help()


def test_a_shared_type_makes_a_flag_without_a_model() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_flag(parser, "--wait-s", StopWait, default=15.0)
    assert parser.parse_args([]).wait_s == 15.0
    assert parser.parse_args(["--wait-s", "2.5"]).wait_s == 2.5
    for bad in ("0", "121", "inf", "nan"):
        with pytest.raises(argparse.ArgumentError, match="argument --wait-s"):
            parser.parse_args(["--wait-s", bad])


def test_model_from_args_names_the_field_a_cross_field_rule_refused() -> None:
    class Ordered(BaseModel):
        low: int = 1
        high: int = 2

        def model_post_init(self, _context: object) -> None:
            if self.low > self.high:
                raise ValueError("low must not exceed high")

    args = argparse.Namespace(low=5, high=2)
    with pytest.raises(ConfigError, match=r"invalid flags: .*low must not exceed high"):
        model_from_args(Ordered, args, ("low", "high"))
    assert model_from_args(Ordered, argparse.Namespace(low=1), ("low",), high=3).high == 3
