"""MCP adapters: thin functions that validate arguments, call services/connectors, return models.

Each toolset module defines `TOOLSET` (its name) and `register(server, *, read_only)`.
"""
