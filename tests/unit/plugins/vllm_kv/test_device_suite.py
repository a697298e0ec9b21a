"""The device copy path's tests (`device/`) need torch and vLLM: they run here in vLLM's venv."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.vllm import REPO, require_vllm_venv

DEVICE_TESTS = Path(__file__).parent / "device"


def test_the_device_copy_path_tests_pass_in_the_vllm_venv() -> None:
    done = subprocess.run(
        [
            str(require_vllm_venv()),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            "/dev/null",  # the project's pytest options name plugins vLLM's venv does not have
            "--rootdir",
            str(REPO),
            "--confcutdir",
            str(DEVICE_TESTS),
            str(DEVICE_TESTS),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout
