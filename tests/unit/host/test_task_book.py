"""The task book: a task's states, and the bounds (TTL, count) that keep the book small."""

from __future__ import annotations

import pytest

from graph_kvcache_mcp.host.task_book import BookFull, TaskBook

DONE = {"content": [], "isError": False}


def test_a_task_works_then_completes_with_its_result_and_never_changes_again() -> None:
    book = TaskBook()
    book.open("a", "vllm_start", now=10.0)
    book.note("a", "waiting for vLLM /health (5/600)", now=15.0)
    working = book.find("a", now=15.0)
    assert working is not None and working.status == "working"
    assert working.status_message == "waiting for vLLM /health (5/600)"
    book.end("a", 20.0, result=DONE)
    book.end("a", 21.0, error={"code": -32603, "message": "late"})
    book.ask_cancel("a", 22.0)
    done = book.find("a", now=23.0)
    assert done is not None and done.status == "completed" and done.result == DONE
    assert done.updated_at == 20.0


def test_a_tool_error_completes_and_a_protocol_error_fails() -> None:
    book = TaskBook()
    book.open("tool", "cache_warm", now=0.0)
    book.open("rpc", "cache_warm", now=0.0)
    book.end("tool", 1.0, result={"content": [], "isError": True})
    book.end("rpc", 1.0, error={"code": -32602, "message": "unknown tool"})
    tool, rpc = book.find("tool", 1.0), book.find("rpc", 1.0)
    assert tool is not None and tool.status == "completed" and tool.status_message
    assert "with an error" in tool.status_message
    assert (
        rpc is not None
        and rpc.status == "failed"
        and rpc.error
        == {
            "code": -32602,
            "message": "unknown tool",
        }
    )


def test_cancel_ends_cancelled_unless_the_work_completed_first() -> None:
    book = TaskBook()
    for task_id in ("stopped", "too-late"):
        book.open(task_id, "vllm_start", now=0.0)
        book.ask_cancel(task_id, now=1.0)
    book.end("stopped", 2.0, result={"content": [], "isError": True})
    book.end("too-late", 2.0, result=DONE)
    stopped, too_late = book.find("stopped", 2.0), book.find("too-late", 2.0)
    assert stopped is not None and stopped.status == "cancelled" and stopped.result is None
    assert too_late is not None and too_late.status == "completed"


def test_an_ended_task_is_dropped_after_its_ttl_and_a_working_one_is_kept() -> None:
    book = TaskBook(ttl_s=60.0)
    book.open("ended", "engine_start", now=0.0)
    book.open("working", "vllm_start", now=0.0)
    book.end("ended", 1.0, result=DONE)
    assert book.find("ended", now=59.0) is not None
    assert book.find("ended", now=60.0) is None
    assert book.find("working", now=600.0) is not None


def test_a_full_book_drops_its_oldest_ended_task_and_refuses_when_all_work() -> None:
    book = TaskBook(max_tasks=2)
    book.open("old", "engine_start", now=0.0)
    book.open("new", "engine_start", now=1.0)
    book.end("old", 2.0, result=DONE)
    book.end("new", 2.0, result=DONE)
    book.open("third", "vllm_start", now=3.0)
    assert book.find("old", 3.0) is None and book.find("new", 3.0) is not None
    book.open("fourth", "vllm_start", now=4.0)  # drops "new", the only ended one
    with pytest.raises(BookFull, match="2 tasks are still working"):
        book.open("fifth", "vllm_start", now=5.0)
