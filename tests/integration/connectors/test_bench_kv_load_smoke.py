"""CI's benchmark smoke run: `tools/bench_kv_load.py`, small, under vLLM's venv (torch).

It prints the connector's load rate as a share of the plain 8-thread GET loop measured in the
same run (issue #42), so that a regression of the share shows in CI's log. The share is printed,
not asserted: on a shared machine a timing is no pass/fail; what is asserted is that the bench
ran, loaded every block, and printed the line.
"""

from __future__ import annotations

import pytest

from tests.support.bench_smoke import run_bench
from tests.support.vllm import require_vllm_venv


def test_bench_kv_load_prints_the_load_share_of_the_get_loop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = run_bench(require_vllm_venv(), "bench_kv_load.py", "--blocks", "32", "--repeats", "3")
    shares = [line for line in lines if line.startswith("load share [")]
    assert len(shares) == 1, lines
    with capsys.disabled():
        print(f"\n{shares[0]}")
