"""The engine's rules: key rules, limits, the stats model. Pure."""
