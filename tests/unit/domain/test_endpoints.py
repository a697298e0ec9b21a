"""Plain http only to loopback or to hosts the user listed; everything else must be https."""

from __future__ import annotations

import pytest

from graph_kvcache_mcp.domain.endpoints import (
    INSECURE_HOSTS_ENV,
    approve_http_url,
    check_insecure_hosts,
    parse_http_url,
    plain_http_allowed,
)
from graph_kvcache_mcp.errors import ConfigError

LISTED = check_insecure_hosts(["10.0.0.18", "192.168.0.0/16", "GPU-Box.lan.", "fd00::/8"])


def test_listed_entries_are_normalised() -> None:
    assert LISTED == ("10.0.0.18/32", "192.168.0.0/16", "gpu-box.lan", "fd00::/8")


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("[::1]", True),
        ("10.0.0.18", True),
        ("10.0.0.19", False),
        ("192.168.7.9", True),
        ("gpu-box.lan", True),
        ("GPU-BOX.LAN.", True),
        ("other.lan", False),
        ("[fd00::5]", True),
        ("8.8.8.8", False),
    ],
)
def test_plain_http_goes_only_to_loopback_and_listed_hosts(host: str, allowed: bool) -> None:
    assert plain_http_allowed(host, LISTED) is allowed


def test_a_listed_name_does_not_cover_an_address_it_might_resolve_to() -> None:
    assert not plain_http_allowed("10.0.0.18", check_insecure_hosts(["gpu-box.lan"]))


def test_a_refusal_names_the_variable_and_the_https_alternative() -> None:
    with pytest.raises(ConfigError) as caught:
        approve_http_url("http://10.0.0.18:8000/v1", what="VLLM_BASE_URL")
    message = str(caught.value)
    assert "VLLM_BASE_URL" in message and INSECURE_HOSTS_ENV in message and "https://" in message
    approved = approve_http_url("http://10.0.0.18:8000/v1", what="X", insecure_hosts=LISTED)
    assert approved.url == "http://10.0.0.18:8000/v1"
    assert approve_http_url("https://vllm.example.com/v1", what="X").port == 443


@pytest.mark.parametrize("entry", ["not a host", "10.0.0.0/33", "bad_name.lan", "-x.lan"])
def test_a_malformed_entry_is_refused_naming_the_variable(entry: str) -> None:
    with pytest.raises(ConfigError, match=INSECURE_HOSTS_ENV):
        check_insecure_hosts([entry])


def test_parsing_alone_checks_the_shape_not_the_transport() -> None:
    assert parse_http_url("http://10.0.0.18:8000/v1", what="X").host == "10.0.0.18"
    for bad in ("ftp://x", "http://", "http://u:p@h", "http://h/?q=1", "http://h:99999"):
        with pytest.raises(ConfigError):
            parse_http_url(bad, what="X")
