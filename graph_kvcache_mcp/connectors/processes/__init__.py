"""Processes this project starts: spawning and stopping, identity, state files, ports, leases.

Shared by the engine, vLLM and `lmcache server` managers; knows none of them.
"""
