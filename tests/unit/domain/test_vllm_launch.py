"""Launch flags per platform: always prefix caching, CPU-safe choices stated, clashes refused."""

from __future__ import annotations

import json

import pytest

from graph_kvcache_mcp.domain.vllm.launch import (
    Platform,
    VllmLaunch,
    parse_nvidia_smi,
    plan_launch,
)
from graph_kvcache_mcp.domain.vllm.serve_command import tensor_parallel_of
from graph_kvcache_mcp.domain.vllm.wiring import wiring_of
from graph_kvcache_mcp.errors import ConfigError

CPU = Platform(kind="cpu", detail="nvidia-smi not found on PATH")
GPU = Platform(kind="gpu", gpus=["NVIDIA H200, 143771 MiB"], detail="nvidia-smi listed 1 GPU(s)")


def flag_value(args: tuple[str, ...], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_cpu_plan_bounds_kv_memory_uses_eager_and_a_block_multiple_of_32() -> None:
    plan = plan_launch(VllmLaunch(model="/m", port=8123), CPU, host="127.0.0.1")
    assert "--enable-prefix-caching" in plan.args
    assert "--enable-prompt-tokens-details" in plan.args
    assert "--enforce-eager" in plan.args
    assert flag_value(plan.args, "--block-size") == "32"
    assert flag_value(plan.args, "--kv-cache-memory-bytes") == str(1024**3)
    assert flag_value(plan.args, "--port") == "8123"
    assert "--gpu-memory-utilization" not in plan.args
    assert any("no NVIDIA GPU" in note for note in plan.notes)


def test_gpu_plan_uses_memory_utilization_and_leaves_cpu_flags_out() -> None:
    launch = VllmLaunch(model="org/model", gpu_memory_utilization=0.8, max_model_len=8192)
    plan = plan_launch(launch, GPU, host="127.0.0.1")
    assert flag_value(plan.args, "--gpu-memory-utilization") == "0.8"
    assert flag_value(plan.args, "--max-model-len") == "8192"
    assert "--enforce-eager" not in plan.args
    assert "--block-size" not in plan.args
    assert "--enable-prefix-caching" in plan.args


def test_cpu_block_size_must_be_a_multiple_of_32() -> None:
    with pytest.raises(ConfigError, match="multiple of 32"):
        plan_launch(VllmLaunch(model="/m", block_size=16), CPU, host="127.0.0.1")


def test_extra_args_may_not_repeat_flags_the_plan_owns() -> None:
    launch = VllmLaunch(model="/m", extra_args=("--port=9000", "--seed", "1"))
    with pytest.raises(ConfigError, match="--port"):
        plan_launch(launch, CPU, host="127.0.0.1")


def test_extra_args_are_passed_last() -> None:
    launch = VllmLaunch(model="/m", extra_args=("--seed", "7"))
    assert plan_launch(launch, CPU, host="127.0.0.1").args[-2:] == ("--seed", "7")


def test_turning_prompt_token_details_off_drops_the_flag_and_explains_the_fallback() -> None:
    launch = VllmLaunch(model="/m", prompt_tokens_details=False)
    plan = plan_launch(launch, CPU, host="127.0.0.1")
    assert "--enable-prompt-tokens-details" not in plan.args
    assert any("/metrics" in note for note in plan.notes)


def test_nvidia_smi_lines_become_gpu_names() -> None:
    out = "NVIDIA H200, 143771 MiB\n\nNVIDIA H200, 143771 MiB\n"
    assert parse_nvidia_smi(out) == ["NVIDIA H200, 143771 MiB"] * 2
    assert parse_nvidia_smi("") == []


@pytest.mark.parametrize(
    "extra",
    [
        ("--api-key", "sk-1"),
        ("--api-key=sk-1",),
        ("--API-KEY=sk-1",),
        ("--api_key", "sk-1"),
        ("--api-ke", "sk-1"),
        ("--api-k=sk-1",),
        ("--seed", "0", "--api-key", "sk-1"),
    ],
)
def test_an_api_key_in_extra_args_is_refused_in_every_spelling(extra: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match="VLLM_API_KEY") as refused:
        plan_launch(VllmLaunch(model="/m", extra_args=extra), CPU, host="127.0.0.1")
    assert "sk-1" not in str(refused.value)


def test_flags_that_only_share_the_api_prefix_are_kept() -> None:
    plan = plan_launch(
        VllmLaunch(model="/m", extra_args=("--api-server-count", "1")), CPU, host="127.0.0.1"
    )
    assert plan.args[-2:] == ("--api-server-count", "1")


def test_the_engine_connector_sets_the_transfer_config_and_recompute_on_load_failure() -> None:
    launch = VllmLaunch(model="/m", kv_connector="engine")
    plan = plan_launch(launch, CPU, host="127.0.0.1")
    config = json.loads(flag_value(plan.args, "--kv-transfer-config"))
    assert config == {
        "kv_connector": "EngineKVConnector",
        "kv_connector_module_path": "graph_kvcache_mcp.plugins.vllm_kv.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
    }
    assert launch.needs_engine_environment
    assert plan.env == {}  # the engine's URL and token come from the caller, never the plan


def test_the_engine_connector_runs_a_dense_model_on_a_gpu_with_the_same_transfer_config() -> None:
    launch = VllmLaunch(model="/m", kv_connector="engine")
    plan = plan_launch(launch, GPU, host="127.0.0.1")
    config = json.loads(flag_value(plan.args, "--kv-transfer-config"))
    assert config["kv_connector"] == "EngineKVConnector"
    assert any("pinned host memory" in note for note in plan.notes)


@pytest.mark.parametrize(
    "tp_args",
    [("--tensor-parallel-size", "2"), ("--tensor-parallel-size=4",), ("-tp", "2")],
)
def test_the_engine_connector_keys_tensor_parallel_ranks_on_a_gpu_only(
    tp_args: tuple[str, ...],
) -> None:
    launch = VllmLaunch(model="/m", kv_connector="engine", extra_args=tp_args)
    plan = plan_launch(launch, GPU, host="127.0.0.1")
    assert any("each rank under its own keys" in note for note in plan.notes)
    with pytest.raises(ConfigError, match="tensor-parallel ranks on CUDA only"):
        plan_launch(launch, CPU, host="127.0.0.1")


def test_one_tensor_parallel_rank_on_cpu_is_planned_as_before() -> None:
    launch = VllmLaunch(
        model="/m", kv_connector="engine", extra_args=("--tensor-parallel-size", "1")
    )
    assert tensor_parallel_of(launch.extra_args) == 1
    plan_launch(launch, CPU, host="127.0.0.1")


@pytest.mark.parametrize("mode", ["mp_native", "redis_resp"])
def test_lmcache_mp_modes_point_vllm_at_the_lmcache_server_with_a_shared_hash_seed(
    mode: str,
) -> None:
    launch = VllmLaunch.model_validate({"model": "/m", "kv_connector": mode, "lmcache_port": 6001})
    plan = plan_launch(launch, GPU, host="127.0.0.1")
    config = json.loads(flag_value(plan.args, "--kv-transfer-config"))
    assert config["kv_connector"] == "LMCacheMPConnector"
    assert config["kv_connector_extra_config"]["lmcache.mp.port"] == 6001
    assert plan.env["PYTHONHASHSEED"] == "0"
    assert not launch.needs_engine_environment


def test_an_mp_connector_given_the_servers_private_socket_talks_there() -> None:
    launch = VllmLaunch.model_validate(
        {
            "model": "/m",
            "kv_connector": "mp_native",
            "lmcache_port": 6001,
            "lmcache_rpc_url": "ipc:///d/lmcache/rpc-6001.sock",
        }
    )
    plan = plan_launch(launch, GPU, host="127.0.0.1")
    extra = json.loads(flag_value(plan.args, "--kv-transfer-config"))["kv_connector_extra_config"]
    assert extra["lmcache.mp.server_urls"] == ["ipc:///d/lmcache/rpc-6001.sock"]
    assert extra["lmcache.mp.port"] == 6001  # still names the server (stack, diagnosis)


def test_the_inprocess_plugin_names_its_config_file_and_needs_the_engine_environment() -> None:
    launch = VllmLaunch(model="/m", kv_connector="inprocess_plugin", lmcache_config_file="/c.yaml")
    plan = plan_launch(launch, CPU, host="127.0.0.1")
    assert json.loads(flag_value(plan.args, "--kv-transfer-config"))["kv_connector"] == (
        "LMCacheConnectorV1"
    )
    assert plan.env["LMCACHE_CONFIG_FILE"] == "/c.yaml"
    assert launch.needs_engine_environment
    assert any("no CPU connector" in note for note in plan.notes)


def test_a_kv_connector_and_a_hand_written_transfer_config_clash() -> None:
    launch = VllmLaunch(
        model="/m", kv_connector="engine", extra_args=("--kv-transfer-config", "{}")
    )
    with pytest.raises(ConfigError, match="--kv-transfer-config"):
        plan_launch(launch, CPU, host="127.0.0.1")


def test_kv_events_publish_on_the_endpoints_the_lifecycle_picked() -> None:
    launch = VllmLaunch(
        model="/m",
        kv_events=True,
        kv_events_endpoint="ipc:///run/x/kv-events.sock",
        kv_events_replay_endpoint="tcp://127.0.0.1:5558",
    )
    config = json.loads(
        flag_value(plan_launch(launch, CPU, host="127.0.0.1").args, "--kv-events-config")
    )
    assert config["endpoint"] == "ipc:///run/x/kv-events.sock"
    assert config["replay_endpoint"] == "tcp://127.0.0.1:5558"
    assert config["enable_kv_cache_events"] is True and config["publisher"] == "zmq"
    assert "--kv-events-config" not in plan_launch(VllmLaunch(model="/m"), CPU, host="h").args
    with pytest.raises(ConfigError, match="both endpoints"):
        plan_launch(VllmLaunch(model="/m", kv_events=True), CPU, host="127.0.0.1")
    with pytest.raises(ConfigError, match="kv-events-config"):
        plan_launch(
            launch.model_copy(update={"extra_args": ("--kv-events-config={}",)}),
            CPU,
            host="127.0.0.1",
        )


def test_the_engine_connector_gives_a_stop_time_to_upload_the_queued_saves() -> None:
    plan = plan_launch(VllmLaunch(model="/m", kv_connector="engine"), CPU, host="127.0.0.1")
    assert flag_value(plan.args, "--shutdown-timeout") == "12"
    assert any("--shutdown-timeout 12" in note for note in plan.notes)
    chosen = VllmLaunch(model="/m", kv_connector="engine", extra_args=("--shutdown-timeout", "60"))
    args = plan_launch(chosen, CPU, host="127.0.0.1").args
    assert args.count("--shutdown-timeout") == 1 and flag_value(args, "--shutdown-timeout") == "60"
    plain = plan_launch(VllmLaunch(model="/m"), CPU, host="127.0.0.1")
    assert "--shutdown-timeout" not in plain.args


def test_the_engine_connector_is_told_where_to_publish_its_identity_and_the_wiring_records_it() -> (
    None
):
    launch = VllmLaunch(model="/m", kv_connector="engine", kv_identity_file="/d/vllm/id.json")
    plan = plan_launch(launch, CPU, host="127.0.0.1")
    config = json.loads(flag_value(plan.args, "--kv-transfer-config"))
    assert config["kv_connector_extra_config"] == {"identity_file": "/d/vllm/id.json"}
    assert wiring_of(plan.args).identity_file == "/d/vllm/id.json"
    assert wiring_of(plan_launch(VllmLaunch(model="/m"), CPU, host="h").args).identity_file is None
