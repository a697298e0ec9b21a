"""`graph-kvcache-mcp vllm ...` against a real vLLM: the same models as the tools, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.services.vllm.views import (
    VllmChatOut,
    VllmMetricsOut,
    VllmStatusOut,
    VllmTraceSummaryOut,
)
from tests.support.peers import garbage_peer, slow_peer
from tests.support.vllm import BLOCK_SIZE, RunningVllm
from tests.support.vllm_peers import failing_vllm_peer, proxy_page_peer


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.vllm
def test_chat_twice_with_a_system_file_then_summarize_the_trace_file(
    vllm_server: RunningVllm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    system = tmp_path / "system.txt"
    rules = " ".join(f"Point {i}: answers stay short." for i in range(90))
    system.write_text(f"Run {uuid.uuid4().hex}. {rules}")
    traces = tmp_path / "traces.jsonl"
    common = ["--base-url", vllm_server.base_url, "--system-file", str(system)]
    common += ["--max-tokens", "3", "--trace-file", str(traces)]
    code1, out1, _ = run(capsys, "vllm", "chat", "--message", "one", "--json", *common)
    code2, out2, err2 = run(capsys, "vllm", "chat", "--message", "two", *common)
    code3, out3, _ = run(capsys, "vllm", "summary", str(traces), "--json")
    first = VllmChatOut.model_validate_json(out1)
    summary = VllmTraceSummaryOut.model_validate_json(out3).summary
    assert (code1, code2, code3) == (0, 0, 0)
    assert first.trace is not None and first.trace.prefix_cache_hit_tokens == 0
    assert out2.strip() != "" and "prompt tokens from the prefix cache (usage)" in err2
    assert len(traces.read_text().splitlines()) == 2
    assert summary.calls == 2 and summary.total_tokens_saved > 0
    assert summary.total_tokens_saved % BLOCK_SIZE == 0


@pytest.mark.vllm
def test_metrics_status_and_logs_print_json_or_a_table(
    vllm_server: RunningVllm, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--base-url", vllm_server.base_url]
    data = ["--data-dir", str(vllm_server.managed.data_dir)]
    code1, out1, _ = run(capsys, "vllm", "metrics", *url, "--model", vllm_server.model, "--json")
    code2, out2, _ = run(capsys, "vllm", "metrics", *url)
    code3, out3, _ = run(capsys, "vllm", "status", *url, *data, "--json")
    code4, out4, _ = run(capsys, "vllm", "logs", *data, "--lines", "5")
    snapshot = VllmMetricsOut.model_validate_json(out1).snapshot
    status = VllmStatusOut.model_validate_json(out3)
    assert (code1, code2, code3, code4) == (0, 0, 0, 0)
    assert snapshot is not None
    assert snapshot.model_name == vllm_server.model and snapshot.prefix_cache_queries_tokens
    assert "prefix cache hits (tokens)" in out2 and "block size" in out2
    assert (status.managed_by_us, status.pid) == (True, vllm_server.pid)
    assert 0 < len(out4.strip().splitlines()) <= 5


@pytest.mark.vllm
def test_metrics_for_an_unknown_model_is_bad_input(
    vllm_server: RunningVllm, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        capsys, "vllm", "metrics", "--base-url", vllm_server.base_url, "--model", "x"
    )
    assert code == 2 and vllm_server.model in err


def test_chat_with_vllm_down_exits_3_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    code, out, _ = run(capsys, "vllm", "chat", "--base-url", url, "--message", "hi", "--json")
    printed = VllmChatOut.model_validate_json(out)
    assert (code, printed.reachable) == (3, False)
    assert printed.reason is not None and "not reachable" in printed.reason


@pytest.mark.parametrize(
    ("peer", "words"),
    [
        (lambda: slow_peer(hold_s=30), "did not answer within 0.5 s"),
        (garbage_peer, "bad answer (not valid HTTP"),
        (proxy_page_peer, "bad answer (not the shape of an OpenAI answer)"),
        (lambda: failing_vllm_peer("EngineCore died"), "HTTP 500: EngineCore died"),
    ],
)
def test_chat_against_a_vllm_that_cannot_answer_exits_3_with_what_happened(
    peer: Callable[[], AbstractContextManager[str]],
    words: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GRAPH_KVCACHE_VLLM_TIMEOUT_S", "0.5")
    with peer() as url:
        argv = ["--base-url", url, "--model", "m", "--message", "hi"]
        code, out, _ = run(capsys, "vllm", "chat", *argv, "--json")
        human_code, _, err = run(capsys, "vllm", "chat", *argv)
    printed = VllmChatOut.model_validate_json(out)
    assert (code, human_code, printed.reachable) == (3, 3, False)
    assert printed.reason is not None and words in printed.reason
    assert words in err


def test_metrics_from_a_proxy_page_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    with proxy_page_peer() as url:
        code, out, _ = run(capsys, "vllm", "metrics", "--base-url", url, "--json")
    printed = VllmMetricsOut.model_validate_json(out)
    assert (code, printed.reachable) == (3, False)
    assert printed.reason is not None and "not a vLLM server" in printed.reason


def test_start_on_a_held_port_exits_3_and_names_the_holder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, socket, sys; s = socket.socket(); "
            "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('ready', flush=True); "
            "signal.pause()",
            str(port),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        argv = ["vllm", "start", "--model", "/m", "--port", str(port), "--data-dir", str(tmp_path)]
        code, _, err = run(capsys, *argv)
        assert code == 3 and f"pid {holder.pid}" in err
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_bad_start_flags_and_a_missing_trace_file_are_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["vllm", "start", "--model", "/m", "--port", str(free_port()), "--block-size", "16"]
    code1, _, err1 = run(capsys, *argv, "--data-dir", str(tmp_path), "--python", sys.executable)
    code2, _, err2 = run(capsys, "vllm", "summary", str(tmp_path / "none.jsonl"))
    code3, _, err3 = run(capsys, "vllm", "start", "--model", "/m", "--port", "70000")
    assert code1 == 3 and "not importable" in err1  # checked before the flags are planned
    assert code2 == 2 and "none.jsonl" in err2
    assert code3 == 2 and "port" in err3


def test_summary_prints_a_readable_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "t.jsonl"
    line = {
        "model": "m",
        "prompt_tokens": 100,
        "completion_tokens": 1,
        "prefix_cache_hit_tokens": None,
        "prefix_cache_miss_tokens": None,
        "cached_tokens_source": "unavailable",
        "latency_s": 0.01,
    }
    traces.write_text(json.dumps(line) + "\n")
    code, out, _ = run(capsys, "vllm", "summary", str(traces))
    assert code == 0
    assert "calls                  1 (0 with cache info)" in out
    assert "--enable-prompt-tokens-details" in out


def test_status_of_a_proxy_page_on_the_port_exits_3_as_a_bad_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 200 with an HTML page on /v1/models is not vLLM: exit 3 and say so (it was exit 1)."""
    with proxy_page_peer() as url:
        code, out, _ = run(
            capsys, "vllm", "status", "--base-url", url, "--data-dir", str(tmp_path), "--json"
        )
    printed = VllmStatusOut.model_validate_json(out)
    assert (code, printed.reachable) == (3, False)
    assert printed.reason is not None and "bad answer" in printed.reason
