"""Small services that combine connectors and domain logic (probe, cached compile, checks).

Shared by the MCP tools and the CLI so both run the same code and return the same models.
"""
