"""The fleet's certificate rules: names, addresses, validity and usages (pure).

One CA per fleet, dedicated to the edges: any certificate it issued is accepted at every edge
listener, so it must sign nothing else. One certificate per host serves both directions (the
edge's server side and its client side), so it carries both serverAuth and clientAuth. Its
subject alternative names are the host's name (a DNS name: haproxy's `verifyhost` checks DNS
names, not addresses) and every address the host's edge listens on.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime, timedelta
from typing import Annotated, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.errors import InvalidValue

CA_VALIDITY = timedelta(days=3650)
HOST_VALIDITY = timedelta(days=397)
"""What browsers allow a server certificate at most; a host certificate is rotated well before."""
CLOCK_SKEW = timedelta(minutes=5)
"""Certificates start a little in the past, so a peer whose clock runs behind accepts them."""
MAX_NAME_CHARS = 63
MAX_ADDRESSES = 16

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")

IpAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
HostName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]


def check_host_name(name: str) -> str:
    """`name` when it can name a host in its certificate (lower-case DNS labels: letters,
    digits, '-', dots between labels).

    Raises:
        InvalidValue: says which rule the name breaks and gives an example of a good one.
    """
    if not name or len(name) > MAX_NAME_CHARS:
        raise InvalidValue(
            f"host name {name[:80]!r} must be 1 to {MAX_NAME_CHARS} characters (e.g. store-1)"
        )
    if not _NAME.match(name):
        raise InvalidValue(
            f"host name {name!r} is not a DNS name: use lower-case letters, digits and '-', "
            "with dots between labels and no '-' at either end of a label (e.g. node-2 or "
            "node-2.fleet)"
        )
    return name


def check_addresses(addresses: list[str]) -> list[IpAddress]:
    """The distinct IP addresses in `addresses`, in order (at least one).

    Raises:
        InvalidValue: none given, too many, or one that is not an IP address.
    """
    if not addresses:
        raise InvalidValue("give the host's address with --ip (e.g. --ip 10.0.0.2)")
    if len(addresses) > MAX_ADDRESSES:
        raise InvalidValue(f"at most {MAX_ADDRESSES} addresses per certificate")
    parsed: list[IpAddress] = []
    for text in addresses:
        try:
            address = ipaddress.ip_address(text.strip())
        except ValueError:
            raise InvalidValue(
                f"{text[:80]!r} is not an IP address; give the address the host's edge listens "
                "on (e.g. --ip 10.0.0.2 or --ip fd00::2)"
            ) from None
        if address.is_unspecified or address.is_multicast:
            raise InvalidValue(f"{address} cannot name a host; give the host's own address")
        if address not in parsed:
            parsed.append(address)
    return parsed


class HostRequest(BaseModel):
    """What a host certificate is issued for: its name and the addresses its edge listens on."""

    model_config = ConfigDict(frozen=True)

    name: HostName
    addresses: list[IpAddress]

    @classmethod
    def of(cls, name: str, addresses: list[str]) -> HostRequest:
        """A checked request.

        Raises:
            InvalidValue: a bad name or address (see `check_host_name`, `check_addresses`).
        """
        return cls(name=check_host_name(name), addresses=check_addresses(addresses))


class Validity(BaseModel):
    """When a certificate is valid."""

    model_config = ConfigDict(frozen=True)

    not_before: datetime
    not_after: datetime


def validity(now: datetime, lifetime: timedelta) -> Validity:
    """A certificate's window: from a little before `now` (clock skew) for `lifetime`."""
    return Validity(not_before=now - CLOCK_SKEW, not_after=now + lifetime)


def ca_common_name(fleet: str) -> str:
    return f"graph-kvcache-mcp fleet CA {fleet}"


class CaSummary(BaseModel):
    """A fleet CA as `fleet pki init` reports it (the key never leaves its file)."""

    model_config = ConfigDict(frozen=True)

    directory: str = Field(description="Where the CA's certificate and key live (0700).")
    ca_certificate: str = Field(description="The CA certificate every host trusts (ca.pem).")
    subject: str
    fingerprint_sha256: str = Field(description="Compare on each host before trusting ca.pem.")
    not_after: datetime


class HostCertificate(BaseModel):
    """A host certificate as `fleet pki issue` (and the edge) report it."""

    model_config = ConfigDict(frozen=True)

    name: str
    addresses: list[str]
    serial: str = Field(description="Hex serial number: tells the served certificate apart.")
    not_before: datetime
    not_after: datetime
    ca_fingerprint_sha256: str
    directory: str | None = Field(
        None, description="Where ca.pem, cert.pem and key.pem were written (0600 each)."
    )
