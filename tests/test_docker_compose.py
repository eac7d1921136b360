"""docker-compose.yml is valid: `docker-compose config` parses it (no Docker engine is needed for that)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = {"gateway", "spark-master", "spark-worker", "scheduler"}


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("the docker-compose command is missing (Debian: apt-get install -y docker-compose)")
    return subprocess.run([exe, "-f", str(ROOT / "docker-compose.yml"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_docker_compose_config_is_valid_and_has_every_service() -> None:
    result = _compose("config")
    assert result.returncode == 0, result.stderr
    services = _compose("config", "--services")
    assert services.returncode == 0, services.stderr
    assert set(services.stdout.split()) == SERVICES
    volumes = _compose("config", "--volumes")
    assert volumes.stdout.split() == ["warehouse"], "one warehouse volume, shared"
    config = result.stdout
    assert "spark://spark-master:7077" in config, "the scheduler submits its jobs to the compose master"
    assert config.count("target: /warehouse") + config.count("warehouse:/warehouse") >= len(SERVICES), config
