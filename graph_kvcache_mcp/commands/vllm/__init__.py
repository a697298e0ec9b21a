"""`graph-kvcache-mcp vllm chat|metrics|start|stop|status|logs|summary|restart-reuse`: vLLM from
the shell.

Each verb calls the same operation as its tool (`services.vllm`) and `--json` prints the model the
tool returns. Flags with bounds are read from the same declarations as the tool parameters
(`commands/_flags.py`). Exit codes: 0 ok, 2 bad input (a flag out of bounds, vLLM refused the
request, unknown model), 3 vLLM unavailable (unreachable, timed out, or a bad answer: the reason
says which).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from graph_kvcache_mcp.commands._common import Verbs, common_options
from graph_kvcache_mcp.commands._flags import add_flag
from graph_kvcache_mcp.commands.vllm._handlers import (
    run_chat,
    run_logs,
    run_metrics,
    run_restart_reuse,
    run_status,
    run_stop,
    run_summary,
)
from graph_kvcache_mcp.commands.vllm._start import add_start_flags, run_start
from graph_kvcache_mcp.domain.lifecycle import LogLines, ReadyTimeout, StopWait
from graph_kvcache_mcp.domain.vllm.chat import AnswerTokens, Temperature
from graph_kvcache_mcp.services.vllm.restart_reuse import RestartMode, ReusePromptTokens

__all__ = ["register"]


def register(subparsers: Verbs) -> None:
    group = subparsers.add_parser("vllm", help="talk to, measure and manage a vLLM server")
    verbs = group.add_subparsers(dest="verb", required=True)
    parent = common_options()
    target = argparse.ArgumentParser(add_help=False)
    target.add_argument(
        "--base-url",
        dest="vllm_base_url",
        default=None,
        help="vLLM OpenAI base URL (default: $VLLM_BASE_URL or http://127.0.0.1:8000/v1)",
    )
    _add_chat(verbs, [parent, target])
    metrics = verbs.add_parser("metrics", parents=[parent, target], help="/metrics snapshot")
    metrics.add_argument("--model", default=None, help="model_name to report (default: all)")
    metrics.set_defaults(handler=run_metrics)

    start = verbs.add_parser("start", parents=[parent, target], help="start (or reuse) vLLM")
    add_start_flags(start)
    start.set_defaults(handler=run_start)

    _add_restart_reuse(verbs, [parent])
    _add_process_verbs(verbs, parent, target)

    summary = verbs.add_parser("summary", parents=[parent], help="summarize a JSONL trace file")
    summary.add_argument("traces", type=Path, help="JSONL file, one trace per line")
    summary.set_defaults(handler=run_summary)


def _add_chat(verbs: Verbs, parents: list[argparse.ArgumentParser]) -> None:
    chat = verbs.add_parser("chat", parents=parents, help="one chat call + its trace")
    chat.add_argument("--model", default=None, help="served model (default: the only one)")
    chat.add_argument("--message", required=True, help="the user turn")
    chat.add_argument("--system-file", type=Path, default=None, help="system message file")
    add_flag(chat, "--max-tokens", AnswerTokens, default=64, help="answer length cap")
    add_flag(chat, "--temperature", Temperature, default=0.0, help="0 = greedy (repeatable)")
    chat.add_argument("--stream", action="store_true", help="stream (measures TTFT)")
    chat.add_argument("--trace-file", type=Path, default=None, help="append the trace (JSONL)")
    chat.set_defaults(handler=run_chat)


def _add_restart_reuse(verbs: Verbs, parents: list[argparse.ArgumentParser]) -> None:
    reuse = verbs.add_parser(
        "restart-reuse",
        parents=parents,
        help="cold call, restart vLLM, same call: KV reuse through the engine",
    )
    add_flag(
        reuse,
        "--prompt-tokens",
        ReusePromptTokens,
        default=2048,
        help="about how long the test prompt is, in tokens",
    )
    add_flag(
        reuse,
        "--ready-timeout-s",
        ReadyTimeout,
        default=600.0,
        help="how long the restarted vLLM may take (default 600 s)",
    )
    reuse.add_argument(
        "--restart",
        choices=get_args(RestartMode),
        default="vllm",
        help="vllm, or stack (mp_native: the lmcache server too, so hits come from the engine)",
    )
    reuse.set_defaults(handler=run_restart_reuse)


def _add_process_verbs(
    verbs: Verbs, parent: argparse.ArgumentParser, target: argparse.ArgumentParser
) -> None:
    stop = verbs.add_parser("stop", parents=[parent], help="stop the vLLM we started")
    add_flag(stop, "--wait-s", StopWait, default=15.0, help="SIGTERM grace before SIGKILL")
    stop.set_defaults(handler=run_stop)

    status = verbs.add_parser("status", parents=[parent, target], help="is it running, answering")
    status.set_defaults(handler=run_status)

    logs = verbs.add_parser("logs", parents=[parent], help="tail the managed vLLM's log")
    add_flag(logs, "--lines", LogLines, default=50, help="how many last lines (default 50)")
    logs.set_defaults(handler=run_logs)
