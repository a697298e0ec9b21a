"""What to launch vLLM with: the request, the platform, and the flags they make. Pure: no I/O.

Prefix caching and per-call cached-token counts are the point of running vLLM here, so the plan
always asks for `--enable-prefix-caching` and (unless told otherwise, e.g. to test the fallback)
`--enable-prompt-tokens-details`. On a machine without an NVIDIA GPU the plan picks flags vLLM's
CPU backend needs or benefits from, and says why in `notes`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.engine.environment import KV_TIMEOUT_ENV, KV_TOKEN_ENV, KV_URL_ENV
from graph_kvcache_mcp.domain.lifecycle import ServicePort
from graph_kvcache_mcp.domain.lmcache.config import (
    TELEMETRY_OFF,
    inprocess_kv_transfer_config,
    mp_kv_transfer_config,
)
from graph_kvcache_mcp.domain.versions import LMCACHE_VERSION
from graph_kvcache_mcp.domain.vllm.entry import DEV_ROUTES_FILTER
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import gpu_target
from graph_kvcache_mcp.domain.vllm.hybrid.launch import (
    CPU_HYBRID_BLOCK_SIZE,
    plan_hybrid,
    refuse_unservable,
)
from graph_kvcache_mcp.domain.vllm.kv_identity_file import IDENTITY_FILE_KEY
from graph_kvcache_mcp.errors import ConfigError

CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention only takes block sizes that are multiples of 32
DEFAULT_CPU_BLOCK_SIZE = 32
DEFAULT_CPU_KV_CACHE_BYTES = 1024**3
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
ENGINE_CONNECTOR_SHUTDOWN_S = 12
"""vLLM's `--shutdown-timeout` with EngineKVConnector: its 10 s drain of queued saves, and a
margin, inside the 15 s a `vllm stop` waits before SIGKILL."""
# Flags the plan owns: passing them again through extra_args would make vLLM's behaviour depend on
# argparse's "last one wins".
_OWNED_FLAGS = frozenset(
    {
        "--model",
        "--host",
        "--port",
        "--served-model-name",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details",
    }
)


MaxModelLen = Annotated[int, Field(ge=16)]
GpuMemoryUtilization = Annotated[float, Field(gt=0, le=1)]
BlockSize = Annotated[int, Field(ge=1)]
KvCacheBytes = Annotated[int, Field(ge=1024**2)]
"""vLLM's own floor for a KV cache worth having: 1 MiB."""

KvConnector = Literal["none", "engine", "mp_native", "redis_resp", "inprocess_plugin"]
"""vLLM's external KV tier: none, the engine through `EngineKVConnector` (CPU vLLM), or one of
the LMCache modes `lmcache config` plans (the vLLM side of `mp_native` and `redis_resp` is the
same: LMCache's MP connector talking to an `lmcache server`)."""
MP_CONNECTORS = frozenset({"mp_native", "redis_resp"})
"""The modes whose vLLM side is LMCache's MP connector talking to an `lmcache server`."""
ENGINE_CONNECTOR_MODULE = "graph_kvcache_mcp.plugins.vllm_kv.connector"
_ON_CUDA = "; on CUDA it copies through pinned host memory on side streams (one rank)"
ENGINE_ENV_NAMES = (KV_URL_ENV, KV_TOKEN_ENV, KV_TIMEOUT_ENV)
"""The environment through which vLLM's processes learn where the engine is (never flags: vLLM
logs its kv_transfer_config)."""


class Platform(BaseModel):
    """Where vLLM will run, as detected on this machine."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["gpu", "cpu"]
    gpus: list[str] = Field(default_factory=list, description="GPU names nvidia-smi listed.")
    detail: str = Field(description="How the platform was decided.")


class VllmLaunch(BaseModel):
    """What a caller asks for. None means: let the platform decide."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(min_length=1, description="Local model dir or hub id.")
    port: ServicePort = Field(8000, description="Loopback port vLLM listens on.")
    served_model_name: str | None = Field(None, description="Name clients use; default: model.")
    max_model_len: MaxModelLen | None = Field(None, description="Context length cap.")
    dtype: str = Field("auto", description="auto, bfloat16, float16, float32.")
    gpu_memory_utilization: GpuMemoryUtilization | None = Field(
        None, description="GPU only; default 0.9."
    )
    block_size: BlockSize | None = Field(
        None, description="KV block size; CPU needs a multiple of 32."
    )
    kv_cache_memory_bytes: KvCacheBytes | None = Field(
        None, description="KV cache size; CPU default 1 GiB."
    )
    enforce_eager: bool | None = None
    prompt_tokens_details: bool = True
    dev_mode: bool = Field(False, description="VLLM_SERVER_DEV_MODE=1: /reset_prefix_cache etc.")
    kv_connector: KvConnector = Field("none", description="External KV tier (see KvConnector).")
    lmcache_host: str = Field("127.0.0.1", description="The lmcache server (MP modes).")
    lmcache_port: ServicePort = Field(5555, description="The lmcache server's port.")
    lmcache_rpc_url: str | None = Field(
        None, description="The lmcache server's private ipc socket (the lifecycle finds it)."
    )
    lmcache_config_file: str = Field(
        "lmcache.yaml", description="LMCACHE_CONFIG_FILE for inprocess_plugin."
    )
    kv_events: bool = Field(
        False, description="Publish KV events (ZMQ) so the fleet view can index this server."
    )
    kv_events_endpoint: str | None = Field(
        None, description="Where vLLM binds the live feed (the lifecycle picks a private one)."
    )
    kv_events_replay_endpoint: str | None = Field(
        None, description="Where vLLM binds the replay socket (the lifecycle picks a private one)."
    )
    kv_identity_file: str | None = Field(
        None,
        description="Where EngineKVConnector publishes its KV identity (the lifecycle picks a "
        "private one).",
    )
    extra_args: tuple[str, ...] = ()

    @property
    def needs_engine_environment(self) -> bool:
        """vLLM's processes must be told the engine's URL and token (ENGINE_ENV_NAMES)."""
        return self.kv_connector in {"engine", "inprocess_plugin"}

    @property
    def l2_over_resp(self) -> bool:
        """The lmcache server's L2 is the managed engine's RESP wire (LMCache's `resp` adapter),
        not our native adapter: the engine must be started with that wire open."""
        return self.kv_connector == "redis_resp"


class LaunchPlan(BaseModel):
    """The arguments after `python -m vllm.entrypoints.openai.api_server`, and why."""

    model_config = ConfigDict(frozen=True)

    args: tuple[str, ...]
    platform: Platform
    notes: list[str]
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment the plan needs (never a secret)."
    )


_API_KEY_FLAG = "--api-key"
_SHORTEST_API_KEY_ABBREVIATION = "--api-k"  # "--api-" is shared with --api-server-count


def check_extra_args(extra_args: tuple[str, ...]) -> None:
    """Refuse a secret on vLLM's command line: argv is world-readable (/proc/<pid>/cmdline) and
    lands in vLLM's log and in vllm_logs output.

    Any spelling argparse would take counts: `--api-key X`, `--api-key=X`, `--api_key`, and the
    abbreviations `--api-k`, `--api-ke`.

    Raises:
        ConfigError: names the flag and the variable to use instead.
    """
    for arg in extra_args:
        flag = arg.split("=", 1)[0].lower().replace("_", "-")
        if _API_KEY_FLAG.startswith(flag) and len(flag) >= len(_SHORTEST_API_KEY_ABBREVIATION):
            raise ConfigError(
                f"extra_args must not carry {_API_KEY_FLAG}: the key would be visible on vLLM's "
                "command line, in its log and in vllm_logs. Set VLLM_API_KEY in this server's "
                "environment instead: vLLM reads it and the vllm_* tools send it"
            )


def plan_launch(
    launch: VllmLaunch,
    platform: Platform,
    *,
    host: str,
    model_config: Mapping[str, Any] | None = None,
) -> LaunchPlan:
    """Flags for `launch` on `platform`; `model_config` (the model's parsed config.json, when
    it is local) adds what a hybrid needs there.

    Raises:
        ConfigError: a block size the CPU backend cannot use, extra_args that repeat a flag
            the plan sets itself, an api key in extra_args, or a hybrid the platform cannot
            serve (`hybrid.launch.refuse_unservable`).
    """
    lmcache_mp = launch.kv_connector in MP_CONNECTORS
    hybrid = refuse_unservable(model_config, platform.kind, lmcache_mp=lmcache_mp)
    notes: list[str] = []
    if hybrid is not None and platform.kind == "cpu" and launch.block_size is None:
        launch = launch.model_copy(update={"block_size": CPU_HYBRID_BLOCK_SIZE})
        notes.append(
            f"block {CPU_HYBRID_BLOCK_SIZE} for a hybrid on CPU: vLLM's own CPU default; a step "
            "of one block stays at least vLLM's CPU max_num_seqs"
        )
    check_extra_args(launch.extra_args)
    clashes = sorted({arg.split("=", 1)[0] for arg in launch.extra_args} & _OWNED_FLAGS)
    if clashes:
        raise ConfigError(
            f"extra_args repeat flags this launcher sets itself ({', '.join(clashes)}); use the "
            "matching parameters instead"
        )
    args = ["--model", launch.model, "--host", host, "--port", str(launch.port)]
    if launch.served_model_name:
        args += ["--served-model-name", launch.served_model_name]
    args += ["--dtype", launch.dtype, "--enable-prefix-caching"]
    if launch.prompt_tokens_details:
        args.append("--enable-prompt-tokens-details")
    if launch.max_model_len is not None:
        args += ["--max-model-len", str(launch.max_model_len)]
    if platform.kind == "cpu":
        args += _cpu_flags(launch, notes)
    else:
        args += _gpu_flags(launch, notes)
    if hybrid is not None:
        recipe = plan_hybrid(
            hybrid,
            platform.kind,
            block_size=launch.block_size,
            lmcache_mp=lmcache_mp,
            extra_args=launch.extra_args,
            target=gpu_target(platform.gpus[0]) if platform.gpus else None,
        )
        args += recipe.flags
        notes += recipe.notes
    if not launch.prompt_tokens_details:
        notes.append(
            "without --enable-prompt-tokens-details vLLM leaves usage.prompt_tokens_details "
            "empty: cached tokens then come from /metrics deltas, or are reported unavailable"
        )
    env: dict[str, str] = {}
    if launch.kv_connector != "none":
        args += _kv_connector_flags(launch, platform, env, notes)
    if launch.kv_events:
        args += _kv_events_flags(launch, notes)
    args += ["--middleware", DEV_ROUTES_FILTER] if launch.dev_mode else []
    args += launch.extra_args
    return LaunchPlan(
        args=tuple(args),
        platform=platform,
        notes=notes,
        env=env,
    )


def kv_transfer_config(launch: VllmLaunch) -> dict[str, Any] | None:
    """vLLM's `--kv-transfer-config` for `launch.kv_connector` (None for "none")."""
    match launch.kv_connector:
        case "engine":
            config: dict[str, Any] = {
                "kv_connector": "EngineKVConnector",
                "kv_connector_module_path": ENGINE_CONNECTOR_MODULE,
                "kv_role": "kv_both",
                # a block that vanished or fails its checksum is recomputed, never an error
                "kv_load_failure_policy": "recompute",
            }
            if launch.kv_identity_file:
                # where the connector says how it keys blocks, for the fleet view's engine tier
                extra = {IDENTITY_FILE_KEY: launch.kv_identity_file}
                config["kv_connector_extra_config"] = extra
            return config
        case "mp_native" | "redis_resp":
            return mp_kv_transfer_config(
                launch.lmcache_host, launch.lmcache_port, launch.lmcache_rpc_url
            )
        case "inprocess_plugin":
            return inprocess_kv_transfer_config()
    return None


def _kv_connector_flags(
    launch: VllmLaunch, platform: Platform, env: dict[str, str], notes: list[str]
) -> list[str]:
    if any(arg.split("=", 1)[0] == "--kv-transfer-config" for arg in launch.extra_args):
        raise ConfigError(
            "extra_args repeat --kv-transfer-config, which kv_connector sets; drop one of them"
        )
    transfer = kv_transfer_config(launch)
    if launch.kv_connector == "engine":
        notes.append(
            "--kv-transfer-config EngineKVConnector: the engine is vLLM's KV tier; vLLM's venv "
            "needs this package (pip install --no-deps graph-kvcache-mcp) and gets the engine's "
            f"URL and token through its environment{_ON_CUDA if platform.kind != 'cpu' else ''}"
        )
    else:
        # LMCache hashes prompts with Python's hash seed: every process must share it.
        env.update({"PYTHONHASHSEED": "0", **TELEMETRY_OFF})
        if launch.kv_connector == "inprocess_plugin":
            env["LMCACHE_CONFIG_FILE"] = launch.lmcache_config_file
        if platform.kind == "cpu" and launch.kv_connector == "inprocess_plugin":
            notes.append(
                f"LMCache has no CPU connector in-process ({LMCACHE_VERSION}): on CPU vLLM it "
                "falls back to recompute; use kv_connector 'mp_native' (lmcache server) or 'engine'"
            )
        elif platform.kind == "cpu":
            # vLLM's CPU workers set up gloo on the first interface otherwise, which may be
            # down or not loopback.
            env["GLOO_SOCKET_IFNAME"] = "lo"
            notes.append(
                "CPU vLLM with LMCache's MP connector: the lmcache server must run with "
                "--supported-transfer-mode auto and --shm-name (the stack start plans it so)"
            )
        notes.append(f"--kv-transfer-config {json.dumps(transfer)}")
    flags = ["--kv-transfer-config", json.dumps(transfer, separators=(",", ":"))]
    if launch.kv_connector == "engine" and not any(
        arg.split("=", 1)[0] == "--shutdown-timeout" for arg in launch.extra_args
    ):
        # vLLM's API server kills its engine processes `--shutdown-timeout` s (default 0: at
        # once) into a stop; the connector's worker first uploads the saves still queued (up
        # to 10 s), so a restart gets every block of the last request back.
        flags += ["--shutdown-timeout", str(ENGINE_CONNECTOR_SHUTDOWN_S)]
        notes.append(
            f"--shutdown-timeout {ENGINE_CONNECTOR_SHUTDOWN_S}: a stop lets EngineKVConnector "
            "upload the saves still queued (up to 10 s) before vLLM's processes exit"
        )
    return flags


KV_EVENTS_BUFFER_STEPS = 10_000


def kv_events_config(endpoint: str, replay_endpoint: str) -> dict[str, Any]:
    """vLLM's `--kv-events-config` publishing on `endpoint`, replaying on `replay_endpoint`."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay_endpoint,
        "buffer_steps": KV_EVENTS_BUFFER_STEPS,
        "topic": "kv",
    }


def _kv_events_flags(launch: VllmLaunch, notes: list[str]) -> list[str]:
    if any(arg.split("=", 1)[0] == "--kv-events-config" for arg in launch.extra_args):
        raise ConfigError("extra_args repeat --kv-events-config, which kv_events sets; drop one")
    if not launch.kv_events_endpoint or not launch.kv_events_replay_endpoint:
        raise ConfigError("kv_events needs both endpoints (the lifecycle picks them)")
    config = kv_events_config(launch.kv_events_endpoint, launch.kv_events_replay_endpoint)
    notes.append(
        f"--kv-events-config: KV events on {launch.kv_events_endpoint} (replay "
        f"{launch.kv_events_replay_endpoint}); vLLM binds a tcp feed only on every interface, so "
        "the live feed is a private ipc socket"
    )
    return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]


def _cpu_flags(launch: VllmLaunch, notes: list[str]) -> list[str]:
    block = launch.block_size or DEFAULT_CPU_BLOCK_SIZE
    if block % CPU_BLOCK_MULTIPLE:
        raise ConfigError(
            f"block_size {block} cannot run on vLLM's CPU backend: use a multiple of "
            f"{CPU_BLOCK_MULTIPLE} (e.g. 32 or 128)"
        )
    kv_bytes = launch.kv_cache_memory_bytes or DEFAULT_CPU_KV_CACHE_BYTES
    eager = True if launch.enforce_eager is None else launch.enforce_eager
    notes.append("no NVIDIA GPU found: using CPU-safe flags")
    notes.append(f"--block-size {block}: CPU attention needs a multiple of {CPU_BLOCK_MULTIPLE}")
    notes.append(f"--kv-cache-memory-bytes {kv_bytes}: the KV cache is bounded in host memory")
    flags = ["--block-size", str(block), "--kv-cache-memory-bytes", str(kv_bytes)]
    if eager:
        flags.append("--enforce-eager")
        notes.append("--enforce-eager: skips torch.compile warm-up (startup about 2-3x faster)")
    if launch.gpu_memory_utilization is not None:
        notes.append("gpu_memory_utilization ignored: there is no GPU")
    return flags


def _gpu_flags(launch: VllmLaunch, notes: list[str]) -> list[str]:
    utilization = launch.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
    flags = ["--gpu-memory-utilization", str(utilization)]
    notes.append(f"NVIDIA GPU found: --gpu-memory-utilization {utilization}")
    if launch.block_size is not None:
        flags += ["--block-size", str(launch.block_size)]
    if launch.kv_cache_memory_bytes is not None:
        flags += ["--kv-cache-memory-bytes", str(launch.kv_cache_memory_bytes)]
    if launch.enforce_eager:
        flags.append("--enforce-eager")
    return flags


def parse_nvidia_smi(output: str) -> list[str]:
    """GPU descriptions from `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader`."""
    return [line.strip() for line in output.splitlines() if line.strip()]
