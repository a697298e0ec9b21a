"""How to deploy LMCache with the engine as its remote tier: the mode and the choices a caller
makes. Pure: no I/O.

The bounded types here are the only declaration of these parameters: `LmcacheChoices` uses them,
and so do the lmcache_* tool signatures and the `lmcache config|start` flags.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.lifecycle import ServicePort
from graph_kvcache_mcp.domain.lmcache.keys import DEFAULT_NAMESPACE, Namespace
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import GpuChoice, VllmVersion

Mode = Literal["mp_native", "redis_resp", "inprocess_plugin"]
MODES: tuple[Mode, ...] = ("mp_native", "redis_resp", "inprocess_plugin")
ServerMode = Literal["mp_native", "redis_resp"]
"""The modes that run an `lmcache server` (inprocess_plugin runs LMCache inside vLLM)."""

ChunkSize = Annotated[int, Field(ge=1)]
BlockTokens = Annotated[int, Field(ge=1)]
TensorParallelSize = Annotated[int, Field(ge=1, le=64)]
SizeGb = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class LmcacheChoices(BaseModel):
    """How to deploy: mode, addresses, sizes. Defaults suit one host."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = "mp_native"
    engine_url: str = Field("http://127.0.0.1:9130", description="The engine's KV base URL.")
    insecure_http_hosts: tuple[str, ...] = Field(
        (),
        description="Hosts plain http may go to (GRAPH_KVCACHE_INSECURE_HTTP_HOSTS, as "
        "`check_insecure_hosts` returns them): the engine URL is approved by the policy the "
        "engine client applies, never a stricter or looser one.",
    )
    namespace: Namespace = Field(
        DEFAULT_NAMESPACE, description="Key namespace hashed into every engine key."
    )
    chunk_size: ChunkSize | None = Field(None, description="Tokens per LMCache chunk.")
    mamba_block_size: BlockTokens | None = Field(
        None, description="vLLM's attention block size for a hybrid (from its log)."
    )
    tensor_parallel_size: TensorParallelSize = Field(
        1, description="vLLM --tensor-parallel-size (KV per rank)."
    )
    lmcache_host: str = "127.0.0.1"
    lmcache_port: ServicePort = Field(5555, description="The lmcache server's port.")
    lmcache_http_port: ServicePort = Field(8080, description="Its HTTP admin port.")
    l1_size_gb: SizeGb = Field(20.0, description="The server's L1 (host memory) size in GB.")
    max_local_cpu_size_gb: float = Field(5.0, gt=0)
    num_workers: int = Field(4, ge=1, le=64)
    max_connections: int = Field(16, ge=1, le=256)
    redis_host: str = "127.0.0.1"
    redis_port: int = Field(6390, ge=1, le=65535)
    vllm_port: int = Field(8000, ge=1, le=65535)
    config_file: str = Field("lmcache.yaml", description="Path of the in-process YAML.")
    python_hash_seed: int = Field(0, ge=0)
    vllm_block_size: int | None = Field(
        None, ge=1, description="vLLM's KV block size; chunks must be a whole number of blocks."
    )
    cpu: bool = Field(
        False,
        description="vLLM runs on CPU: the server takes the shared-memory transfer path "
        "(--supported-transfer-mode auto --shm-name), the one a CPU worker registers with.",
    )
    gpu: GpuChoice | None = None
    vllm_version: VllmVersion | None = None
    shm_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_]{1,64}$",
        description="Name of the L1 pool in /dev/shm (cpu only); default from the port.",
    )

    @property
    def l1_shm_name(self) -> str:
        """The L1 pool's name: `/dev/shm/lmcache_l1_pool_<name>` while the server runs."""
        return self.shm_name or f"graphkv_{self.lmcache_port}"
