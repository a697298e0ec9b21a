"""A managed vLLM's state record as a test writes or hands it (no process behind it)."""

from __future__ import annotations

from graph_kvcache_mcp.connectors.processes.identity import ProcessRecord
from graph_kvcache_mcp.connectors.vllm.state import VllmState
from graph_kvcache_mcp.domain.vllm.launch import Platform
from graph_kvcache_mcp.domain.vllm.wiring import KvWiring


def vllm_record(
    process: ProcessRecord, *, port: int, base_url: str, wiring: KvWiring | None = None
) -> VllmState:
    """The record of a CPU vLLM serving model "m" on 127.0.0.1:`port`, wired as `wiring` says."""
    return VllmState(
        process=process,
        host="127.0.0.1",
        port=port,
        base_url=base_url,
        model="m",
        served_model_name="m",
        platform=Platform(kind="cpu", detail="test"),
        notes=[],
        dev_mode=False,
        prompt_tokens_details=True,
        kv_wiring=wiring,
    )
