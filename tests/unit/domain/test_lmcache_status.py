from __future__ import annotations

from graph_kvcache_mcp.domain.lmcache.status import report_from_status


def test_status_is_reduced_to_health_l1_usage_and_each_adapter() -> None:
    status = {
        "is_healthy": True,
        "chunk_size": 256,
        "hash_algorithm": "blake3",
        "active_sessions": 1,
        "storage_manager": {
            "l1_manager": {
                "memory_used_bytes": 10,
                "memory_total_bytes": 100,
                "total_object_count": 2,
            },
            "l2_adapters": [{"is_healthy": True, "x": 1}, {"is_healthy": False}],
        },
    }
    report = report_from_status(status)
    assert (report.healthy, report.chunk_size, report.hash_algorithm) == (True, 256, "blake3")
    assert (report.l1_used_bytes, report.l1_total_bytes, report.l1_objects) == (10, 100, 2)
    assert [(a.index, a.healthy) for a in report.l2_adapters] == [(0, True), (1, False)]


def test_fields_the_server_did_not_send_stay_unknown_not_zero() -> None:
    report = report_from_status({"storage_manager": "odd", "chunk_size": True})
    assert report.healthy is None and report.chunk_size is None and report.l1_used_bytes is None
    assert report.l2_adapters == []
