"""The fleet view's pure rules: the fleet file, KV event shapes, the block index keyed by token
chain content, feed freshness, findings, pressure ranking and effectiveness deltas."""
