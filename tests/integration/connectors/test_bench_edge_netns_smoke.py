"""CI's benchmark smoke run: `tools/bench_edge.py --netns`, small, as root.

It prints the engine's HEAD 4 KiB and GET 1 MiB through both edges (store and node as network
namespaces) as ratios to the same over the namespaces' plain TCP (issue #37's "Numbers"), so a
regression shows in CI's log. The ratios are printed, not asserted: on a shared machine a timing
is no pass/fail; what is asserted is that the bench ran every path, byte-exact, and printed the
table and the GET ratio. Skipped, saying why, when not root.
"""

from __future__ import annotations

import sys

import pytest

from tests.support.bench_smoke import run_bench
from tests.support.fleet_tls import require_haproxy
from tests.support.netns import require_netns

SMALL_RUN = ("--netns", "--ops", "20", "--blocks", "2")


def test_bench_edge_netns_prints_the_edges_ratio_to_plain_tcp(
    capsys: pytest.CaptureFixture[str],
) -> None:
    require_netns()
    require_haproxy()
    lines = run_bench(sys.executable, "bench_edge.py", *SMALL_RUN)
    rows = [line for line in lines if line.startswith(("plain TCP ", "edges, http mode "))]
    ratio = [line for line in lines if line.startswith("GET 1 MiB through both edges: ")]
    assert len(rows) == 2 and len(ratio) == 1, lines
    with capsys.disabled():
        print("", *rows, *ratio, sep="\n")
