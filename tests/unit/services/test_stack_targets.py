"""Which target a vLLM URL, a coordinator argument or the lmcache setting names: managed here
(this data dir serves it) or configured (something else runs it). Resolution reads nothing and
starts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import KvTarget
from graph_kvcache_mcp.domain.targets import Configured, ManagedHere, not_managed_here
from graph_kvcache_mcp.errors import ConfigError, VllmProcessError
from graph_kvcache_mcp.services.stack.runtime import lmcache_target
from graph_kvcache_mcp.services.stack.stack import Stack


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "http://localhost:8123/v1"])
def test_a_url_where_this_data_dir_serves_vllm_is_managed_here(url: str, tmp_path: Path) -> None:
    stack = Stack.of(Settings.build(data_dir=tmp_path))
    assert stack.vllm_target(url) == ManagedHere("vLLM", stack.settings.data_dir, url)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.2:8000/v1", "https://gpu-box.example.com/v1", "http://[::1]:8000/v1"]
)
def test_any_other_vllm_url_is_configured(url: str, tmp_path: Path) -> None:
    target = Stack.of(Settings.build(data_dir=tmp_path)).vllm_target(url)
    assert target == Configured("vLLM", url)
    assert not_managed_here(target).startswith(f"not managed here: {url} ")


def test_a_vllm_url_that_is_not_http_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="VLLM_BASE_URL"):
        Stack.of(Settings.build(data_dir=tmp_path)).vllm_target("ftp://127.0.0.1/v1")


def test_the_coordinator_is_the_data_dirs_own_or_one_named_by_url(tmp_path: Path) -> None:
    stack = Stack.of(Settings.build(data_dir=tmp_path))
    assert stack.coordinator_target("managed") == ManagedHere(
        "lmcache coordinator", stack.settings.data_dir
    )
    assert stack.coordinator_target("http://127.0.0.1:8300/") == Configured(
        "lmcache coordinator", "http://127.0.0.1:8300"
    )
    with pytest.raises(ConfigError, match="coordinator"):
        stack.coordinator_target("http://10.9.8.7:8300")  # plain http off loopback, unlisted


def test_the_engine_target_speaks_the_same_vocabulary(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9130"
    managed = KvTarget(url, None, "managed", data_dir=tmp_path)
    assert managed.target == ManagedHere("engine", tmp_path, url)
    for source in ("configured", "default"):
        assert KvTarget(url, None, source).target == Configured("engine", url)


def test_a_managed_engine_target_names_the_data_dir_that_records_it() -> None:
    with pytest.raises(ValueError, match="data dir"):
        KvTarget("http://127.0.0.1:9130", None, "managed")
    with pytest.raises(ValueError, match="data dir"):
        KvTarget("http://127.0.0.1:9130", None, "configured", data_dir=Path("/tmp"))


def test_logs_of_a_configured_vllm_are_not_read_from_this_data_dir(tmp_path: Path) -> None:
    stack = Stack.of(Settings.build(data_dir=tmp_path))
    with pytest.raises(VllmProcessError) as refused:
        stack.vllm_logs("https://gpu-box.example.com/v1", lines=10)
    message = str(refused.value)
    assert message.startswith("not managed here: https://gpu-box.example.com/v1 ")
    assert "read it on gpu-box.example.com" in message and str(stack.vllm.log_path) in message
    here = stack.vllm_logs("http://127.0.0.1:8000/v1", lines=10)  # ours: read (none yet)
    assert (here.exists, here.log_path) == (False, str(stack.vllm.log_path))


def test_a_coordinator_url_on_a_listed_host_is_accepted_as_the_engine_url_would_be(
    tmp_path: Path,
) -> None:
    listed = Stack.of(Settings.build(data_dir=tmp_path, insecure_http_hosts=("10.9.8.0/24",)))
    assert listed.coordinator_target("http://10.9.8.7:8300") == Configured(
        "lmcache coordinator", "http://10.9.8.7:8300"
    )
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_INSECURE_HTTP_HOSTS"):
        listed.coordinator_target("http://10.9.9.7:8300")


def test_the_lmcache_server_is_the_configured_one_else_the_data_dirs(tmp_path: Path) -> None:
    managed = lmcache_target(Settings.build(data_dir=tmp_path))
    assert managed == ManagedHere("lmcache server", tmp_path)
    url = "https://lmcache.example:8080"
    configured = lmcache_target(Settings.build(data_dir=tmp_path, lmcache_url=url + "/"))
    assert configured == Configured("lmcache server", url)
