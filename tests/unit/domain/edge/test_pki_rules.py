"""The fleet's certificate rules: which names and addresses a host certificate may carry."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta

import pytest

from graph_kvcache_mcp.domain.edge.pki import (
    CLOCK_SKEW,
    HOST_VALIDITY,
    HostRequest,
    check_addresses,
    check_host_name,
    validity,
)
from graph_kvcache_mcp.errors import InvalidValue


@pytest.mark.parametrize("name", ["store", "node-2", "node-2.fleet", "a", "x" * 63])
def test_a_dns_name_names_a_host(name: str) -> None:
    assert check_host_name(name) == name


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "1 to 63"),
        ("x" * 64, "1 to 63"),
        ("Node", "not a DNS name"),
        ("node_2", "not a DNS name"),
        ("-node", "not a DNS name"),
        ("node-", "not a DNS name"),
        ("node..2", "not a DNS name"),
        ("node 2", "not a DNS name"),
        ("*.fleet", "not a DNS name"),
    ],
)
def test_a_name_that_is_no_dns_name_is_refused_with_the_rule(name: str, says: str) -> None:
    with pytest.raises(InvalidValue, match=says):
        check_host_name(name)


def test_addresses_are_parsed_deduplicated_and_kept_in_order() -> None:
    assert check_addresses(["10.0.0.2", "fd00::2", "10.0.0.2"]) == [
        ipaddress.ip_address("10.0.0.2"),
        ipaddress.ip_address("fd00::2"),
    ]


@pytest.mark.parametrize(
    ("addresses", "says"),
    [
        ([], "--ip"),
        (["10.0.0"], "not an IP address"),
        (["node-2"], "not an IP address"),
        (["0.0.0.0"], "cannot name a host"),
        (["224.0.0.1"], "cannot name a host"),
        ([f"10.0.0.{i}" for i in range(1, 18)], "at most 16"),
    ],
)
def test_bad_addresses_are_refused_with_the_reason(addresses: list[str], says: str) -> None:
    with pytest.raises(InvalidValue, match=says):
        check_addresses(addresses)


def test_a_request_checks_both_name_and_addresses() -> None:
    request = HostRequest.of("node-2", ["10.0.0.2"])
    assert request.name == "node-2"
    assert request.addresses == [ipaddress.ip_address("10.0.0.2")]
    with pytest.raises(InvalidValue):
        HostRequest.of("node_2", ["10.0.0.2"])


def test_validity_starts_before_now_by_the_clock_skew_and_lasts_its_lifetime() -> None:
    now = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    window = validity(now, HOST_VALIDITY)
    assert window.not_before == now - CLOCK_SKEW
    assert window.not_after == now + timedelta(days=397)
