"""docker-compose.yml is valid: `docker-compose config` parses it (no Docker engine is needed for that).

The command comes from Debian's `docker-compose` package, which `.ci/run` installs in CI; set-up never
installs it, so elsewhere the test is skipped unless it is already there.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = {"s3", "gateway", "gateway-2", "gateway-3", "spark-master", "spark-worker", "scheduler", "scheduler-s3"}
WAREHOUSE_USERS = {"gateway", "gateway-2", "gateway-3", "spark-master", "spark-worker", "scheduler", "scheduler-s3"}
S3_CLIENTS = {"gateway", "gateway-2", "gateway-3", "spark-worker", "scheduler", "scheduler-s3"}


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("the docker-compose command is missing (CI installs Debian's docker-compose in .ci/run)")
    return subprocess.run([exe, "-f", str(ROOT / "docker-compose.yml"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def _services(config: str) -> dict[str, str]:
    """Each service's block of `docker-compose config` output, by name."""
    body = ("\n" + config).split("\nservices:\n", 1)[1].split("\nversion:", 1)[0].split("\nvolumes:\n", 1)[0]
    blocks: dict[str, str] = {}
    name = ""
    for line in body.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and line.rstrip().endswith(":"):
            name = line.strip()[:-1]
            blocks[name] = ""
        elif name:
            blocks[name] += line + "\n"
    return blocks


def test_docker_compose_config_is_valid_and_has_every_service() -> None:
    result = _compose("--profile", "scale-out", "config")
    assert result.returncode == 0, result.stderr
    services = _compose("--profile", "scale-out", "config", "--services")
    assert services.returncode == 0, services.stderr
    assert set(services.stdout.split()) == SERVICES
    volumes = _compose("config", "--volumes")
    assert sorted(volumes.stdout.split()) == ["s3-data", "warehouse"], "one warehouse volume, shared; the store's data"
    blocks = _services(result.stdout)
    assert set(blocks) == SERVICES
    for name in ("scheduler", "scheduler-s3"):
        assert "spark://spark-master:7077" in blocks[name], f"{name} submits its jobs to the compose master"
    assert "s3://jetlake/warehouse" in blocks["scheduler-s3"], "the jobs of the object-storage warehouse"
    assert "JETLAKE_SPARK_DRIVER_HOST: scheduler-s3" in blocks["scheduler-s3"], "executors reach the driver"
    assert "org.apache.spark.deploy.master.Master" in blocks["spark-master"]
    assert "org.apache.spark.deploy.worker.Worker" in blocks["spark-worker"]
    for name in WAREHOUSE_USERS:
        assert "target: /warehouse" in blocks[name] or "warehouse:/warehouse" in blocks[name], name
    for name in S3_CLIENTS:
        assert "AWS_ENDPOINT_URL: http://s3:9000" in blocks[name], f"{name} reaches the compose S3 server"
        assert "AWS_ACCESS_KEY_ID: jetlake" in blocks[name], name


def test_the_s3_service_runs_the_projects_server_script_reachable_in_the_network() -> None:
    result = _compose("--profile", "scale-out", "config")
    assert result.returncode == 0, result.stderr
    s3 = _services(result.stdout)["s3"]
    assert "scripts/s3-server.sh" in s3 and "JETLAKE_S3_HOST: 0.0.0.0" in s3, s3
    assert "target: /data" in s3 or "s3-data:/data" in s3, s3
    for name in ("gateway-2", "gateway-3"):  # two gateways of one cluster on the object-storage warehouse
        block = _services(result.stdout)[name]
        assert "s3://jetlake/warehouse" in block and "--cluster" in block, block
        assert f"http://{name}:4280" in block, "each advertises the address the other forwards to"
    default = _compose("config", "--services")
    assert default.returncode == 0, default.stderr
    assert "gateway" in default.stdout.split()
