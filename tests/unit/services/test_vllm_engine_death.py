"""The managed vLLM's worker death in a status and a failed call, read from a real log file in a
data dir (the captured lines of a worker killed by SIGILL)."""

from __future__ import annotations

from pathlib import Path

import anyio

from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.services.stack.engine_death import chat_with_death, status_with_death
from graph_kvcache_mcp.services.vllm.views import VllmChatOut, VllmStatusOut

SIGILL_LOG = (Path(__file__).parents[1] / "domain" / "data" / "vllm_worker_sigill.log").read_text()
START = "\n=== graph-kvcache-mcp: python -m vllm.entrypoints.openai.api_server --port 8000\n"
BASE_URL = "http://127.0.0.1:8000/v1"


def managed_with_log(tmp_path: Path, text: str) -> ManagedVllm:
    managed = ManagedVllm(tmp_path / "data", tidy=False)
    managed.log_path.parent.mkdir(parents=True)
    managed.log_path.write_text(text)
    return managed


def down(data_dir: Path) -> VllmStatusOut:
    return VllmStatusOut(
        running=False,
        data_dir=str(data_dir),
        reason="no managed vLLM runs",
        tools_base_url=BASE_URL,
    )


def test_a_down_vllm_whose_worker_died_since_its_start_says_so(tmp_path: Path) -> None:
    managed = managed_with_log(tmp_path, START + SIGILL_LOG)
    status = status_with_death(down(managed.data_dir), managed)
    assert status.worker_death is not None and status.worker_death.signal == "SIGILL"
    assert status.reason is not None and status.reason.startswith(
        "the engine died: vLLM's worker VllmWorker-0 was killed by SIGILL"
    )


def test_a_death_before_the_last_start_is_history(tmp_path: Path) -> None:
    managed = managed_with_log(tmp_path, START + SIGILL_LOG + START + "INFO: started\n")
    status = status_with_death(down(managed.data_dir), managed)
    assert status.worker_death is None and status.reason == "no managed vLLM runs"


def test_a_failed_call_names_the_death_before_its_own_reason(tmp_path: Path) -> None:
    managed = managed_with_log(tmp_path, START + SIGILL_LOG)
    failed = VllmChatOut(reachable=False, base_url=BASE_URL, reason="vLLM at ... sent HTTP 500")
    out = anyio.run(chat_with_death, failed, managed)
    assert out.reason is not None
    assert out.reason.startswith("the engine died: ")
    assert out.reason.endswith("(the call: vLLM at ... sent HTTP 500)")
    answered = VllmChatOut(reachable=True, base_url=BASE_URL, answer="hi")
    assert anyio.run(chat_with_death, answered, managed) is answered


def test_without_a_log_nothing_changes(tmp_path: Path) -> None:
    managed = ManagedVllm(tmp_path / "data", tidy=False)
    status = down(managed.data_dir)
    assert status_with_death(status, managed) is status
