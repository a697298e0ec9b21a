"""Loopback ports: is one taken, wait until it is free, let the OS pick a free one."""

from __future__ import annotations

import errno
import socket
import time


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on (host, port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def bind_refusal(host: str, port: int) -> str | None:
    """Why a listener cannot bind (host, port) now: taken, or not an address of this host
    (None when it can)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{host}:{port} is in use by another listener"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{host} is not an address of this host"
            return f"{host}:{port} cannot be bound ({exc.strerror or exc})"
    return None


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    """True once nothing listens on (host, port), polling up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while port_in_use(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port
