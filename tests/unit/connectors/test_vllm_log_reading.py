"""What vLLM's log says when it failed, and which rendezvous file a start left: read from log
text as vLLM 0.32 (CPU) writes it."""

from __future__ import annotations

from pathlib import Path

from graph_kvcache_mcp.connectors.vllm.health import rendezvous_files, vllm_reason

RENDEZVOUS = "/tmp/vllm_dist_" + "0123456789abcdef" * 2
CORE = "(EngineCore pid=4242) ERROR 12-03 18:01:09 [core.py:1112] "
ROOT_CAUSE = (
    "ValueError: To serve at least one request with the models's max seq len (4096), 2.0 MiB "
    "KV cache is needed, which is larger than the available KV cache memory (1.0 MiB)."
)
FAILED_START = "\n".join(
    [
        "=== graph-kvcache-mcp: python -m vllm.entrypoints.openai.api_server --port 8123",
        "(EngineCore pid=4242) INFO 12-03 18:01:02 [parallel_state.py:1906] world_size=1 rank=0 "
        f"local_rank=0 distributed_init_method=file://{RENDEZVOUS} backend=gloo",
        CORE + "EngineCore failed to start.",
        CORE + "Traceback (most recent call last):",
        CORE + '  File "vllm/v1/core/kv_cache_utils.py", line 712, in check_enough_kv_cache_memory',
        CORE + ROOT_CAUSE,
        "Traceback (most recent call last):",
        '  File "vllm/entrypoints/openai/api_server.py", line 10, in <module>',
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {}",
        "",
    ]
)


def test_a_failed_start_is_explained_by_the_engine_cores_own_error_not_the_generic_one(
    tmp_path: Path,
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "=== graph-kvcache-mcp: an earlier start\nOSError: an old failure\n" + FAILED_START
    )

    reason = vllm_reason(log)

    assert reason.endswith(ROOT_CAUSE)
    assert "Engine core initialization failed" not in reason


def test_the_rendezvous_file_of_the_last_start_is_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    earlier = FAILED_START.replace("0123456789abcdef" * 2, "f" * 32)
    log.write_text(earlier + FAILED_START)

    assert rendezvous_files(log) == [Path(RENDEZVOUS)]
