"""Every command's --help is complete: every flag and argument has help text, every command a
description, and each group's usage lists all its verbs (#39 item 8)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from graph_kvcache_mcp.cli import build_parser

NO_HELP_NEEDED = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def test_every_flag_and_argument_has_help_text() -> None:
    missing = [
        (" ".join(path), (action.option_strings or [action.dest])[0])
        for path, parser in commands(build_parser())
        for action in parser._actions
        if not isinstance(action, NO_HELP_NEEDED) and not action.help
    ]
    assert missing == []


def test_every_command_has_a_description() -> None:
    bare = [" ".join(path) for path, parser in commands(build_parser()) if not parser.description]
    assert bare == []


def test_each_group_s_usage_lists_every_verb() -> None:
    for path, parser in commands(build_parser()):
        if not path:
            continue  # the top level lists its commands under COMMAND
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                usage = parser.format_usage()
                assert all(verb in usage for verb in action.choices), (path, usage)


def test_demo_help_says_what_it_does_and_what_it_needs() -> None:
    (demo,) = [parser for path, parser in commands(build_parser()) if path == ("demo",)]
    assert "[engine]" in demo.format_help() and "MCP session" in demo.format_help()
