"""The host's TLS edge: haproxy run as a managed child, carrying every hop between hosts with
mutual TLS (`process.ManagedEdge`), its readiness and runtime API (`haproxy`), and the models
its status, stop and rotate answer with (`state`)."""
