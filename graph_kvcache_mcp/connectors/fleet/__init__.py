"""The fleet from outside: each instance's KV event feed (ZMQ, with replay) and its probes
(through `connectors/vllm`). Like `connectors/stack`, this package may import the vLLM and
engine connectors; none of them imports it."""
