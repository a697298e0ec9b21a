from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.endpoints import ENABLE_WORDS
from graph_kvcache_mcp.domain.engine.environment import KV_TOKEN_FILE_ENV
from graph_kvcache_mcp.errors import ConfigError


def test_url_wins_over_addr() -> None:
    settings = Settings.from_env(
        {
            "EPISTEMIC_GRAPH_KVCACHE_URL": "http://127.0.0.1:9200",
            "EPISTEMIC_GRAPH_KVCACHE_ADDR": "9300",
        }
    )
    assert settings.kv_url == "http://127.0.0.1:9200"


@pytest.mark.parametrize(
    ("addr", "url"),
    [
        ("9131", "http://127.0.0.1:9131"),
        ("127.0.0.1:9140", "http://127.0.0.1:9140"),
        ("localhost:9150", "http://localhost:9150"),
        ("1", "http://127.0.0.1:9130"),
        ("true", "http://127.0.0.1:9130"),
        ("enable", "http://127.0.0.1:9130"),
    ],
)
def test_addr_forms_resolve_like_the_engine_reads_them(addr: str, url: str) -> None:
    assert Settings.from_env({"EPISTEMIC_GRAPH_KVCACHE_ADDR": addr}).kv_url == url


def test_nothing_configured_leaves_the_url_unset_for_the_managed_default() -> None:
    assert Settings.from_env({}).kv_url is None


@pytest.mark.parametrize("addr", ["nonsense", "host:", "99999", "h:0"])
def test_malformed_addr_is_refused_with_the_forms_that_work(addr: str) -> None:
    with pytest.raises(ConfigError, match="EPISTEMIC_GRAPH_KVCACHE_ADDR"):
        Settings.from_env({"EPISTEMIC_GRAPH_KVCACHE_ADDR": addr})


def test_plain_http_to_a_remote_host_is_refused_and_https_is_accepted() -> None:
    with pytest.raises(ConfigError, match="https://"):
        Settings.from_env({"EPISTEMIC_GRAPH_KVCACHE_URL": "http://kv.example.com:9130"})
    ok = Settings.from_env({"EPISTEMIC_GRAPH_KVCACHE_URL": "https://kv.example.com"})
    assert ok.kv_url == "https://kv.example.com:443"


def test_token_never_shows_in_repr_str_or_errors() -> None:
    token = "tok-very-secret-123"
    settings = Settings.from_env({"EPISTEMIC_GRAPH_KVCACHE_TOKEN": token})
    assert token not in repr(settings) and token not in str(settings)
    assert token not in settings.model_dump_json()
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(
            {"EPISTEMIC_GRAPH_KVCACHE_TOKEN": token, "EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S": "x"}
        )
    assert token not in str(caught.value)


def test_bad_timeout_and_flags_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="TIMEOUT_S"):
        Settings.from_env({"EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S": "soon"})
    with pytest.raises(ConfigError, match="kv_timeout_s"):
        Settings.from_env({"EPISTEMIC_GRAPH_KVCACHE_TIMEOUT_S": "-1"})
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_READ_ONLY"):
        Settings.from_env({"GRAPH_KVCACHE_READ_ONLY": "perhaps"})


def test_data_dir_follows_explicit_setting_then_xdg(tmp_path: Path) -> None:
    explicit = Settings.from_env({"GRAPH_KVCACHE_DATA_DIR": str(tmp_path / "d")})
    assert explicit.data_dir == tmp_path / "d"
    xdg = Settings.from_env({"XDG_DATA_HOME": str(tmp_path / "x")})
    assert xdg.data_dir == tmp_path / "x" / "graph-kvcache-mcp"


def test_flags_override_the_environment() -> None:
    settings = Settings.from_env(
        {"EPISTEMIC_GRAPH_KVCACHE_ADDR": "9131"}, kv_url="http://127.0.0.1:9999", read_only=None
    )
    assert settings.kv_url == "http://127.0.0.1:9999"
    assert settings.read_only is False


@given(st.integers(min_value=2, max_value=65535))
def test_any_bare_port_maps_to_loopback(port: int) -> None:
    # "1" is not here on purpose: like the engine, we read it as the enable word (-> 9130).
    url = Settings.from_env({"EPISTEMIC_GRAPH_KVCACHE_ADDR": str(port)}).kv_url
    assert url == f"http://127.0.0.1:{port}"


@given(st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz.-"), min_size=1, max_size=30))
def test_plain_http_is_accepted_only_for_loopback_names(host: str) -> None:
    env = {"EPISTEMIC_GRAPH_KVCACHE_URL": f"http://{host}:9130"}
    if host.lower().rstrip(".") == "localhost":
        assert Settings.from_env(env).kv_url is not None
    else:
        with pytest.raises(ConfigError):
            Settings.from_env(env)


def test_listed_insecure_hosts_may_be_sent_plain_http() -> None:
    env = {
        "VLLM_BASE_URL": "http://10.0.0.18:8000/v1",
        "EPISTEMIC_GRAPH_KVCACHE_URL": "http://192.168.4.2:9130",
        "GRAPH_KVCACHE_INSECURE_HTTP_HOSTS": "10.0.0.18, 192.168.0.0/16",
    }
    settings = Settings.from_env(env)
    assert settings.vllm_base_url == "http://10.0.0.18:8000/v1"
    assert settings.kv_url == "http://192.168.4.2:9130"
    assert settings.endpoint_problems == ()
    assert hash(settings) == hash(Settings.from_env(env))


def test_a_server_defers_bad_endpoints_instead_of_refusing_to_start() -> None:
    env = {
        "VLLM_BASE_URL": "http://10.0.0.18:8000/v1",
        "EPISTEMIC_GRAPH_KVCACHE_ADDR": "nonsense",
    }
    with pytest.raises(ConfigError, match="EPISTEMIC_GRAPH_KVCACHE_ADDR"):
        Settings.from_env(env)
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_INSECURE_HTTP_HOSTS"):
        Settings.from_env({"VLLM_BASE_URL": env["VLLM_BASE_URL"]})
    settings = Settings.from_env(env, defer_endpoint_errors=True)
    assert {endpoint for endpoint, _ in settings.endpoint_problems} == {"kv", "vllm"}
    assert "GRAPH_KVCACHE_INSECURE_HTTP_HOSTS" in (settings.endpoint_problem("vllm") or "")
    assert "EPISTEMIC_GRAPH_KVCACHE_ADDR" in (settings.endpoint_problem("kv") or "")
    # Kept as given, so no tool ever falls back to another engine or server.
    assert settings.kv_url == "nonsense"
    assert settings.vllm_base_url == "http://10.0.0.18:8000/v1"


def test_a_malformed_insecure_hosts_setting_is_refused() -> None:
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_INSECURE_HTTP_HOSTS"):
        Settings.from_env({"GRAPH_KVCACHE_INSECURE_HTTP_HOSTS": "not a host"})


def test_file_roots_are_absolute_directories_separated_by_the_os_path_separator() -> None:
    settings = Settings.from_env({"GRAPH_KVCACHE_FILE_ROOTS": f"/srv/a{os.pathsep}/srv/b"})
    assert settings.file_roots == (Path("/srv/a"), Path("/srv/b"))
    assert Settings.from_env({}).file_roots is None
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_FILE_ROOTS"):
        Settings.from_env({"GRAPH_KVCACHE_FILE_ROOTS": "relative/dir"})
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_FILE_ROOTS"):
        Settings.build(file_roots=(Path("relative"),))


def test_vllm_settings_come_from_their_variables_and_blanks_mean_unset() -> None:
    settings = Settings.from_env(
        {
            "VLLM_BASE_URL": "http://127.0.0.1:8001/v1",
            "VLLM_API_KEY": "sk-local",
            "VLLM_MODEL": " tiny-llama ",
        }
    )
    blank = Settings.from_env({"VLLM_MODEL": "", "VLLM_API_KEY": ""})
    assert settings.vllm_base_url == "http://127.0.0.1:8001/v1"
    assert settings.vllm_api_key is not None
    assert settings.vllm_api_key.get_secret_value() == "sk-local"
    assert settings.vllm_model == "tiny-llama"
    assert (blank.vllm_model, blank.vllm_api_key) == (None, None)


def test_vllm_timeout_is_read_from_the_environment_and_checked() -> None:
    assert Settings.from_env({}).vllm_timeout_s == 120.0
    assert Settings.from_env({"GRAPH_KVCACHE_VLLM_TIMEOUT_S": "7.5"}).vllm_timeout_s == 7.5
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_VLLM_TIMEOUT_S"):
        Settings.from_env({"GRAPH_KVCACHE_VLLM_TIMEOUT_S": "soon"})
    with pytest.raises(ConfigError, match="vllm_timeout_s"):
        Settings.from_env({"GRAPH_KVCACHE_VLLM_TIMEOUT_S": "0"})


def test_vllm_probe_timeout_is_read_from_the_environment_and_checked() -> None:
    assert Settings.from_env({}).vllm_probe_timeout_s == 5.0
    env = {"GRAPH_KVCACHE_VLLM_PROBE_TIMEOUT_S": "1.5"}
    assert Settings.from_env(env).vllm_probe_timeout_s == 1.5
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_VLLM_PROBE_TIMEOUT_S"):
        Settings.from_env({"GRAPH_KVCACHE_VLLM_PROBE_TIMEOUT_S": "soon"})


@pytest.mark.parametrize("word", sorted(ENABLE_WORDS))
def test_every_enable_word_of_the_engine_turns_a_setting_on(word: str) -> None:
    assert Settings.from_env({"GRAPH_KVCACHE_READ_ONLY": word.upper()}).read_only is True


@pytest.mark.parametrize("word", ["0", "false", "no", "off", "disabled", ""])
def test_the_off_words_turn_a_setting_off(word: str) -> None:
    assert Settings.from_env({"GRAPH_KVCACHE_READ_ONLY": word}).read_only is False


def test_the_token_file_wins_over_the_token_variable(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-the-file\n")
    token_file.chmod(0o600)
    env = {"EPISTEMIC_GRAPH_KVCACHE_TOKEN": "from-the-variable", KV_TOKEN_FILE_ENV: str(token_file)}

    settings = Settings.from_env(env)

    assert settings.kv_token is not None
    assert settings.kv_token.get_secret_value() == "from-the-file"
    only_variable = Settings.from_env({"EPISTEMIC_GRAPH_KVCACHE_TOKEN": "from-the-variable"})
    assert only_variable.kv_token is not None
    assert only_variable.kv_token.get_secret_value() == "from-the-variable"


def test_a_token_file_others_may_read_or_a_link_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("secret")
    token_file.chmod(0o644)
    link = tmp_path / "link"
    link.symlink_to(token_file)

    with pytest.raises(ConfigError, match="open to other users"):
        Settings.from_env({KV_TOKEN_FILE_ENV: str(token_file)})
    token_file.chmod(0o600)
    with pytest.raises(ConfigError, match="cannot open"):
        Settings.from_env({KV_TOKEN_FILE_ENV: str(link)})


def test_the_feed_hosts_list_is_its_own_setting_and_allows_no_plain_http() -> None:
    settings = Settings.from_env({"GRAPH_KVCACHE_INSECURE_FEED_HOSTS": "10.0.0.0/8, gpu-box"})
    assert settings.insecure_feed_hosts == ("10.0.0.0/8", "gpu-box")
    assert settings.insecure_http_hosts == ()
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_INSECURE_HTTP_HOSTS"):
        Settings.from_env(
            {
                "GRAPH_KVCACHE_INSECURE_FEED_HOSTS": "10.0.0.0/8",
                "VLLM_BASE_URL": "http://10.0.0.18:8000/v1",
            }
        )
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_INSECURE_FEED_HOSTS"):
        Settings.from_env({"GRAPH_KVCACHE_INSECURE_FEED_HOSTS": "not a host"})


def test_a_configured_lmcache_server_is_named_by_its_own_variable_and_checked() -> None:
    assert Settings.from_env({}).lmcache_url is None
    named = Settings.from_env({"GRAPH_KVCACHE_LMCACHE_URL": " https://lmcache.example:8080 "})
    assert named.lmcache_url == "https://lmcache.example:8080"
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_LMCACHE_URL"):
        Settings.from_env({"GRAPH_KVCACHE_LMCACHE_URL": "http://10.0.0.7:8080"})  # plain, remote
    listed = {"GRAPH_KVCACHE_INSECURE_HTTP_HOSTS": "10.0.0.7"}
    allowed = Settings.from_env({**listed, "GRAPH_KVCACHE_LMCACHE_URL": "http://10.0.0.7:8080"})
    assert allowed.lmcache_url == "http://10.0.0.7:8080"
