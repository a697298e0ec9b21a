"""Files on this machine: bounded safe reads, private state, the HTTP token, traces, HF configs."""
