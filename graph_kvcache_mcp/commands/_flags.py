"""CLI flags derived from the declarations the tools use: a model's fields or a shared `Annotated`
type give each flag its name, type, default, help, bounds and Literal choices.

Each flag's value is checked against its declared bounds while argparse reads it, so a value out
of range is exit 2 with the flag named (`argument --port: Input should be ...`), never a
traceback, and the bound is the one the tool and the model enforce.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from graph_kvcache_mcp.domain.lifecycle import ReadyTimeout
from graph_kvcache_mcp.errors import ConfigError, describe_validation

M = TypeVar("M", bound=BaseModel)


def add_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    declared: Any,
    *,
    default: Any = None,
    help: str | None = None,
    dest: str | None = None,
    required: bool = False,
) -> None:
    """`flag` on `parser`, its value checked against the `Annotated` type `declared`.

    A bool becomes a switch (`store_true`); a Literal lists its choices.
    """
    base = _without_none(declared)
    if base is bool:
        parser.add_argument(flag, dest=dest, action="store_true", default=default, help=help)
        return
    choices = _literal_choices(base)
    parser.add_argument(
        flag,
        dest=dest,
        type=_checked(declared),
        choices=choices,
        default=default,
        required=required,
        help=help,
        metavar=None if choices else _metavar(flag),
    )


def add_model_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    fields: Sequence[str],
    *,
    flags: Mapping[str, str] | None = None,
    helps: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """One flag per name in `fields`, read from `model`'s field of that name: `--name-with-dashes`
    (or `flags[name]`), the field's default (or `defaults[name]`) and description (or
    `helps[name]`); the parsed value lands in `args.<name>`."""
    flags, helps, defaults = flags or {}, helps or {}, defaults or {}
    for name in fields:
        info = model.model_fields[name]
        default = defaults.get(name, _default_of(info))
        add_flag(
            parser,
            flags.get(name, "--" + name.replace("_", "-")),
            field_type(info),
            default=default,
            help=helps.get(name, info.description),
            dest=name,
            required=info.is_required() and name not in defaults,
        )


def add_launch_flags(
    parser: argparse.ArgumentParser,
    *,
    program: str,
    python_dest: str,
    python_env: str,
    ready_timeout_s: float,
) -> None:
    """What every start of a managed process takes: `--extra-arg` (repeat), `--python` (the
    interpreter whose venv has the program) and `--ready-timeout-s`."""
    parser.add_argument(
        "--extra-arg",
        action="append",
        default=[],
        metavar="ARG",
        help=f"one more {program} argument (repeat; use --extra-arg=--flag for flags)",
    )
    parser.add_argument(
        "--python",
        dest=python_dest,
        type=Path,
        default=None,
        help=f"interpreter with {program} (default: ${python_env} or this one)",
    )
    add_flag(
        parser,
        "--ready-timeout-s",
        ReadyTimeout,
        default=ready_timeout_s,
        help=f"stop it if not ready by then (default {ready_timeout_s:g} s)",
    )


def field_type(info: FieldInfo) -> Any:
    """The field's type with its bounds, as one `Annotated` type."""
    if not info.metadata:
        return info.annotation
    return Annotated[(info.annotation, *info.metadata)]


def model_from_args(
    model: type[M], args: argparse.Namespace, fields: Sequence[str], **values: Any
) -> M:
    """`model` built from `args.<name>` for each of `fields`, plus `values`.

    Raises:
        ConfigError: what the model refused (a rule between fields), by field name.
    """
    given = {name: getattr(args, name) for name in fields}
    try:
        return model(**given, **values)
    except ValidationError as exc:
        raise ConfigError(f"invalid flags: {describe_validation(exc, whole='flags')}") from None


def _checked(declared: Any) -> Callable[[str], Any]:
    # The adapter is built on first use: every command's parser is built on each start (serve
    # too), and only the flags actually given need one.
    adapters: list[TypeAdapter[Any]] = []

    def parse(text: str) -> Any:
        if not adapters:
            adapters.append(TypeAdapter(_without_none(declared)))
        try:
            return adapters[0].validate_python(text)
        except ValidationError as exc:
            messages = "; ".join(error["msg"] for error in exc.errors(include_url=False))
            raise argparse.ArgumentTypeError(messages) from None

    parse.__name__ = _type_name(declared)  # argparse names the type in its own messages
    return parse


def _without_none(declared: Any) -> Any:
    """`X` for `X | None` (a flag left out is None by default, never the word "None")."""
    if get_origin(declared) is Annotated:
        inner, *metadata = get_args(declared)
        stripped = _without_none(inner)
        return declared if stripped is inner else Annotated[(stripped, *metadata)]
    if get_origin(declared) in (Union, types.UnionType):
        members = [arg for arg in get_args(declared) if arg is not type(None)]
        if len(members) == 1:
            return members[0]
    return declared


def _literal_choices(declared: Any) -> tuple[Any, ...] | None:
    if get_origin(declared) is Annotated:
        return _literal_choices(get_args(declared)[0])
    return get_args(declared) if get_origin(declared) is Literal else None


def _type_name(declared: Any) -> str:
    base = _without_none(declared)
    if get_origin(base) is Annotated:
        base = get_args(base)[0]
    return getattr(base, "__name__", "value")


def _metavar(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_").upper()


def _default_of(info: FieldInfo) -> Any:
    if info.default is not PydanticUndefined:
        return info.default
    if info.default_factory is not None:
        return info.default_factory()  # type: ignore[call-arg]
    return None
