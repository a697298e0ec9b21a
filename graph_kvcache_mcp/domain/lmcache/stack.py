"""The `lmcache server` a managed vLLM with an LMCache MP connector needs: planned from the vLLM
launch, so the two always agree (port, block size, hash seed, transfer mode). Pure: no I/O.

`vllm_start kv_connector=mp_native` starts the engine (L2), this server, then vLLM; the L2
adapter comes from the mode (`mp_native`: our `native_plugin` client of the engine's /kv;
`redis_resp`: LMCache's `resp` adapter), never hard-wired here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.lifecycle import ServicePort
from graph_kvcache_mcp.domain.lmcache.choices import ChunkSize, SizeGb
from graph_kvcache_mcp.domain.lmcache.config import LmcacheChoices, LmcachePlan, plan_lmcache
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts
from graph_kvcache_mcp.domain.lmcache.process_spec import compact_json
from graph_kvcache_mcp.domain.vllm.launch import (
    DEFAULT_CPU_BLOCK_SIZE,
    MP_CONNECTORS,
    Platform,
    VllmLaunch,
)
from graph_kvcache_mcp.errors import ConfigError

MAX_IPC_PATH = 100  # sun_path holds 108 bytes on Linux, less elsewhere


def rpc_socket_path(data_dir: Path, port: int) -> Path | None:
    """Where the managed `lmcache server` of `data_dir` serves its KV RPC instead of TCP `port`:
    a unix socket in its private dir, reachable by its owner only (LMCache's MP protocol has no
    authentication). None when the path is too long for a unix socket: the managed server then
    refuses to start (its TCP port would be every local user's)."""
    path = data_dir / "lmcache" / f"rpc-{port}.sock"
    return path if len(str(path)) <= MAX_IPC_PATH else None


def with_private_rpc(plan: LmcachePlan, data_dir: Path) -> LmcachePlan:
    """`plan` with its vLLM command pointed at the private KV RPC socket the managed server
    of `data_dir` serves (`lmcache start`): its TCP port is bound by nothing of ours, so a vLLM
    sent there would talk to whoever binds it. A data dir too long for the socket gets a
    warning instead (`lmcache start` refuses it). Plans without an lmcache server are kept."""
    transfer = plan.kv_transfer_config
    if plan.mode not in MP_CONNECTORS or transfer is None:
        return plan
    extra = dict(transfer.get("kv_connector_extra_config") or {})
    port = int(extra.get("lmcache.mp.port") or 0)
    path = rpc_socket_path(data_dir, port)
    if path is None:
        warning = (
            f"the data dir {data_dir} is too long for the lmcache server's private KV RPC "
            f"socket (over {MAX_IPC_PATH} characters): `lmcache start` refuses it, and the "
            f"printed vLLM command targets TCP port {port}, which nothing of ours binds; use a "
            "shorter --data-dir"
        )
        return plan.model_copy(update={"warnings": [*plan.warnings, warning]})
    extra["lmcache.mp.server_urls"] = [f"ipc://{path}"]  # wins over host and port in LMCache
    private = {**transfer, "kv_connector_extra_config": extra}
    argv = list(plan.vllm.argv)
    argv[argv.index("--kv-transfer-config") + 1] = compact_json(private)
    note = (
        f"vLLM reaches the lmcache server over its private socket {path}, which the server "
        "`graph-kvcache-mcp lmcache start` starts from this data dir serves (its TCP port is "
        "never bound: LMCache's KV RPC has no authentication)"
    )
    return plan.model_copy(
        update={
            "kv_transfer_config": private,
            "vllm": plan.vllm.model_copy(update={"argv": argv}),
            "notes": [*plan.notes, note],
        }
    )


__all__ = [
    "MAX_IPC_PATH",
    "MP_CONNECTORS",
    "Coordinator",
    "StackOptions",
    "generic_facts",
    "plan_stack_server",
    "rpc_socket_path",
    "with_private_rpc",
]
Coordinator = Annotated[str, Field(description="'managed' or a coordinator URL.")]
"""An LMCache coordinator for the server to join: 'managed' (started in the data dir, stopped
with the server) or the URL of one named by configuration (used, never stopped)."""
STACK_L1_SIZE_GB = 1.0
STACK_ADAPTER_WORKERS = 2


class StackOptions(BaseModel):
    """The server's own choices a vLLM launch does not decide."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    http_port: ServicePort = Field(8080, description="The server's HTTP admin port.")
    l1_size_gb: SizeGb = Field(STACK_L1_SIZE_GB, description="L1 (host memory) size.")
    chunk_size: ChunkSize | None = Field(
        None, description="Tokens per chunk; default 256 (a whole number of vLLM blocks)."
    )
    coordinator: Coordinator | None = Field(
        None,
        description="Join the server to an LMCache coordinator: 'managed' (started in the data "
        "dir) or its URL; default none.",
    )
    coordinator_advertise_ip: str | None = Field(
        None,
        description="Where a coordinator on another host calls the server back (a node's "
        "127.X.Y.Z, mapped by the store's edge); default loopback.",
    )


def plan_stack_server(
    launch: VllmLaunch,
    facts: ModelFacts,
    platform: Platform,
    *,
    engine_url: str,
    options: StackOptions,
    insecure_hosts: tuple[str, ...] = (),
) -> LmcachePlan:
    """The config generator's plan for the server behind `launch`.

    Raises:
        ConfigError: `launch` uses no LMCache MP connector, the ports collide, or the chunk size
            is not a whole number of vLLM's blocks.
    """
    if launch.kv_connector not in MP_CONNECTORS:
        raise ConfigError(
            f"kv_connector {launch.kv_connector!r} runs no lmcache server; the stack start is "
            "for mp_native (and redis_resp)"
        )
    ports = {launch.port, launch.lmcache_port, options.http_port}
    if len(ports) != 3:
        raise ConfigError(
            f"vLLM port {launch.port}, lmcache port {launch.lmcache_port} and lmcache HTTP port "
            f"{options.http_port} must all differ"
        )
    cpu = platform.kind == "cpu"
    block = launch.block_size or (DEFAULT_CPU_BLOCK_SIZE if cpu else None)
    choices = LmcacheChoices(
        mode="redis_resp" if launch.l2_over_resp else "mp_native",
        engine_url=engine_url,
        insecure_http_hosts=insecure_hosts,
        chunk_size=options.chunk_size,
        lmcache_host=launch.lmcache_host,
        lmcache_port=launch.lmcache_port,
        lmcache_http_port=options.http_port,
        l1_size_gb=options.l1_size_gb,
        num_workers=STACK_ADAPTER_WORKERS,
        vllm_port=launch.port,
        vllm_block_size=block,
        cpu=cpu,
    )
    return plan_lmcache(facts, choices)


def generic_facts(model: str) -> ModelFacts:
    """Stand-in facts when the model has no local config.json: the plan is then sized for a
    small dense model (only the engine value-cap check uses the size)."""
    return ModelFacts(name=model, attention_layers=1, kv_heads=1, head_dim=64)
