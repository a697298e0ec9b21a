"""Diagnosis: why a request missed, what is misconfigured, KV memory budgets. Pure."""
