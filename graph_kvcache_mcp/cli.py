"""`graph-kvcache-mcp`: the console entry. Parses, builds settings, dispatches to `commands/`.

Bad input (`InvalidKey`, `InvalidValue`, `ConfigError`) exits 2 with one line on stderr; a managed
process that cannot start or stop exits 3. No traceback for anything a user can fix. With
`--json` the error is also one JSON object on stdout (`CliErrorOut`), so a script reads it there.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from graph_kvcache_mcp import __version__
from graph_kvcache_mcp.commands import (
    bundle,
    cache,
    demo,
    diagnose,
    edge,
    engine,
    fleet,
    kv,
    lmcache,
    serve,
    vllm,
)
from graph_kvcache_mcp.commands._common import (
    EXIT_BAD_INPUT,
    EXIT_UNAVAILABLE,
    refuse,
    settings_from_args,
)
from graph_kvcache_mcp.errors import (
    ConfigError,
    GraphKvcacheError,
    InvalidKey,
    InvalidValue,
    ProcessError,
)

COMMAND_GROUPS = (serve, demo, engine, edge, kv, bundle, vllm, lmcache, diagnose, fleet, cache)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graph-kvcache-mcp",
        description="MCP server and CLI for an LLM KV-cache stack "
        "(engine KV store, vLLM, LMCache).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(subparsers)
    _describe_every_command(parser)
    return parser


def _describe_every_command(parser: argparse.ArgumentParser) -> None:
    """Give each command's `--help` a description: its own, else the line the list of commands
    shows for it (so no `--help` opens with a bare usage line)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        listed = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            if not sub.description and listed.get(name):
                sub.description = listed[name]
            _describe_every_command(sub)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    parser = build_parser()
    try:
        args = parser.parse_args(serve.default_to_serve(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help, or a flag argparse refused (it said why): its exit code
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(handler(args, settings_from_args(args)))
    except (InvalidKey, InvalidValue, ConfigError) as exc:
        return refuse(args, str(exc), EXIT_BAD_INPUT)
    except ProcessError as exc:
        return refuse(args, str(exc), EXIT_UNAVAILABLE)
    except OSError as exc:
        where = getattr(exc, "filename", "") or ""
        return refuse(args, f"{exc.strerror or exc} ({where})", EXIT_BAD_INPUT)
    except GraphKvcacheError as exc:  # any other typed error of ours: the message says why
        return refuse(args, str(exc), EXIT_BAD_INPUT)
    except (ValueError, RecursionError) as exc:  # e.g. a NUL byte in a path, absurd nesting
        return refuse(args, f"bad input: {str(exc)[:300]}", EXIT_BAD_INPUT)
