"""LMCache's rules: model KV geometry, config plans, key mapping, deploy files, status. Pure."""
