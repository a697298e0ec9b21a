"""What the managed vLLM's lifecycle records and reports: the state file's model and the results
of status, stop and logs (on the shared `processes/status` models). Pure data: the lifecycle
itself is `process`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.connectors.processes.state_file import ProcessState
from graph_kvcache_mcp.connectors.processes.status import ProcessStatus, StopResult
from graph_kvcache_mcp.domain.vllm.launch import Platform
from graph_kvcache_mcp.domain.vllm.wiring import KvWiring, wiring_of


class VllmState(ProcessState):
    """`state.json`: the server we started. Holds no secret (the environment is not recorded)."""

    host: str
    port: int
    base_url: str
    model: str
    served_model_name: str
    platform: Platform
    notes: list[str]
    dev_mode: bool
    prompt_tokens_details: bool
    kv_events: str | None = Field(None, description="The KV event feed vLLM publishes on.")
    kv_events_replay: str | None = Field(None, description="Its replay socket.")
    rendezvous: list[str] = Field(
        default_factory=list,
        description="The `vllm_dist_*` files it named in its log once ready: removed at stop.",
    )
    shared_memory: list[str] = Field(
        default_factory=list,
        description="The /dev/shm segments its processes mapped by the time it was ready: "
        "those no live process maps are removed at stop.",
    )
    plan_env: dict[str, str] = Field(
        default_factory=dict,
        description="The launch plan's own environment (never a secret), which a restart must "
        "give the new process again, e.g. PYTHONHASHSEED for the LMCache connectors.",
    )
    kv_wiring: KvWiring | None = Field(
        None, description="Its KV connector and lmcache server, read from the command we built."
    )

    @property
    def wiring(self) -> KvWiring:
        """How its KV tier is wired; a record written before `kv_wiring` existed is read from
        its recorded command instead."""
        return self.kv_wiring or wiring_of(self.process.command)


class VllmStatus(ProcessStatus):
    """What `vllm status` / `vllm start` report."""

    reachable: bool = False
    port: int | None = None
    base_url: str | None = Field(None, description="OpenAI base URL (…/v1).")
    model: str | None = None
    served_models: list[str] = Field(default_factory=list)
    platform: Platform | None = None
    notes: list[str] = Field(default_factory=list, description="Why these flags were chosen.")
    dev_mode: bool | None = None
    prompt_tokens_details: bool | None = None
    kv_events: str | None = Field(None, description="KV event feed (fleet view), if published.")
    kv_events_replay: str | None = None
    startup_s: float | None = Field(None, description="Launch to healthy, for a fresh start.")


class VllmStopResult(StopResult):
    """What `vllm stop` did."""

    leftover_pids: list[int] = Field(
        default_factory=list, description="Processes of its group still alive after the stop."
    )


class VllmLogs(BaseModel):
    model_config = ConfigDict(frozen=True)

    log_path: str
    exists: bool
    lines: int
    text: str
