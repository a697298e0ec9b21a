"""What `vllm start --kv-connector engine` refuses before vLLM starts, so the user hears it from
the plan instead of from the connector's start-up refusal (`kv_blocks.unsupported_setup`) in
vLLM's log. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from graph_kvcache_mcp.domain.vllm.serve_command import tensor_parallel_of


def engine_connector_refusal(
    platform_kind: str, extra_args: Sequence[str], *, hybrid: bool
) -> str | None:
    """Why EngineKVConnector cannot serve this launch, or None when it can."""
    ranks = tensor_parallel_of(extra_args)
    if hybrid and ranks > 1:
        # Per-rank keys are wired for a dense model's blocks only.
        return (
            f"kv_connector 'engine' keys a hybrid's blocks for one rank; this vLLM would run "
            f"{ranks} ranks: drop --tensor-parallel-size or use kv_connector 'mp_native'"
        )
    if platform_kind == "cpu" and ranks > 1:
        # Per-rank keys are built for the CUDA path only; a multi-rank CPU vLLM was never run.
        return (
            "kv_connector 'engine' keys tensor-parallel ranks on CUDA only; this CPU vLLM "
            f"would run {ranks} ranks: drop --tensor-parallel-size or use kv_connector "
            "'mp_native'"
        )
    return None
