"""The test databases' server choice: a PostgreSQL container image asked for without Docker says so."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import PG_UNAVAILABLE_EXIT

ROOT = Path(__file__).resolve().parents[2]


def test_an_image_asked_for_without_a_docker_engine_stops_the_run_with_a_clear_message(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PETAL_TEST_DSN"}
    env.update(PETAL_TEST_PG_IMAGE="postgres:17", DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'inner'}",
         "tests/store/test_migrate.py::test_migrate_applies_every_file_once_and_a_second_run_is_a_no_op"],
        cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == PG_UNAVAILABLE_EXIT, out
    if importlib.util.find_spec("testcontainers") is not None:
        assert "PETAL_TEST_PG_IMAGE=postgres:17 needs a Docker engine, and none answers" in out, out
        assert "no-docker.sock" in out
    else:
        assert "needs testcontainers: pip install -e '.[containers]'" in out, out
    assert "Traceback" not in out and "passed" not in out
