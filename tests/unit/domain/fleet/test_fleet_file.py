"""The fleet file: its shape, inline secrets refused, the URL policy for HTTP and ZMQ."""

from __future__ import annotations

import json
from typing import Any

import pytest

from graph_kvcache_mcp.domain.fleet.fleet_file import parse_fleet
from graph_kvcache_mcp.errors import ConfigError

A = {
    "name": "a",
    "base_url": "http://127.0.0.1:8001/v1",
    "kv_events": "tcp://127.0.0.1:5557",
    "kv_events_replay": "tcp://127.0.0.1:5558",
}


def parse(raw: Any, *, insecure: tuple[str, ...] = (), feeds: tuple[str, ...] = ()) -> Any:
    return parse_fleet(
        json.dumps(raw), source="fleet.json", insecure_hosts=insecure, feed_hosts=feeds
    )


def test_the_issues_shape_parses() -> None:
    fleet = parse({"instances": [A], "engine_url": None, "lmcache_url": None})
    assert fleet.instances[0].kv_events == "tcp://127.0.0.1:5557"
    assert fleet.instance("a").name == "a"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"api_key": "sk-secret"}, "api_key_env"),
        ({"kv_events": "tcp://*:5557"}, "bind address"),
        ({"kv_events": "tcp://10.0.0.5:5557"}, "GRAPH_KVCACHE_INSECURE_FEED_HOSTS"),
        ({"kv_events": "tcp://127.0.0.1"}, "needs a port"),
        ({"kv_events": "udp://127.0.0.1:1"}, "tcp://127.0.0.1:5557"),
        ({"base_url": "http://10.0.0.5:8000/v1"}, "GRAPH_KVCACHE_INSECURE_HTTP_HOSTS"),
        ({"api_key_env": "not a name"}, "environment variable"),
        ({"name": "a b"}, "letters"),
        ({"kv_events": None}, "kv_events_replay needs kv_events"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_a_bad_entry_is_refused_with_what_to_do(change: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"instances": [{**A, **change}]})
    assert words in str(caught.value)
    assert "sk-secret" not in str(caught.value)


def test_names_must_be_unique_and_there_must_be_an_instance() -> None:
    with pytest.raises(ConfigError, match="unique"):
        parse({"instances": [A, A]})
    with pytest.raises(ConfigError):
        parse({"instances": []})
    with pytest.raises(ConfigError, match="not JSON"):
        parse_fleet("{", source="f")


def test_an_ipc_feed_and_a_listed_insecure_host_are_accepted() -> None:
    fleet = parse(
        {"instances": [{**A, "kv_events": "ipc:///run/vllm/a.sock", "kv_events_replay": None}]}
    )
    assert fleet.instances[0].kv_events == "ipc:///run/vllm/a.sock"
    remote = {**A, "base_url": "http://10.0.0.5:8000/v1", "kv_events": "tcp://10.0.0.5:5557"}
    both = parse({"instances": [remote]}, insecure=("10.0.0.0/8",), feeds=("10.0.0.5",))
    assert both.instances[0].name == "a"


def test_the_plain_http_list_and_the_feed_list_each_allow_only_their_own_risk() -> None:
    http_remote = {**A, "base_url": "http://10.0.0.5:8000/v1"}
    feed_remote = {**A, "kv_events": "tcp://10.0.0.5:5557", "kv_events_replay": None}
    # Listing a host for plain http no longer lets its unauthenticated feed be read ...
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_INSECURE_FEED_HOSTS") as caught:
        parse({"instances": [{**http_remote, **feed_remote}]}, insecure=("10.0.0.5",))
    assert "kv_events" in str(caught.value)
    assert parse({"instances": [http_remote]}, insecure=("10.0.0.5",)).instances[0].name == "a"
    # ... and listing it for feeds sends no token to it in clear.
    with pytest.raises(ConfigError, match="GRAPH_KVCACHE_INSECURE_HTTP_HOSTS"):
        parse({"instances": [http_remote]}, feeds=("10.0.0.0/8",))
    assert parse({"instances": [feed_remote]}, feeds=("10.0.0.0/8",)).instances[0].name == "a"
