"""Loopback networking facts the kernel knows and a peer cannot forge (who owns a socket)."""
