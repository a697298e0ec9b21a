"""Diagnosis use cases: why a request missed, what is misconfigured, KV budgets."""
