"""Processes this project starts: spawning and stopping, identity (through psutil), state files,
ports, leases, and the status/stop model every managed process reports on (`status`).

Shared by the engine, vLLM and `lmcache server` managers; knows none of them.
"""
