"""Killing a job at a named step: `jetlake jobs run <job>` (a fresh Spark session) with a failpoint
(engine/store/failpoints.py) that SIGKILLs it there, then its process group (its JVM) killed too."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import engine.store.failpoints as failpoints
from tests.gateway import JETLAKE


def kill_job_at(warehouse: Path, job: str, step: str, *, spec: str | None = None,
                env: dict[str, str] | None = None, timeout: float = 600.0) -> None:
    """Runs `job` with the failpoint `spec` (default `<step>=kill`) and `env` added to this process's
    environment; asserts it died by SIGKILL at `step`."""
    spec = spec or f"{step}=kill"
    log = warehouse.parent / f"{job}-{spec.replace('=', '-')}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [str(JETLAKE), "jobs", "run", job, "--warehouse", str(warehouse)],
            stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, **(env or {}), failpoints.ENV: spec},
            start_new_session=True,
        )
    try:
        proc.wait(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the JVM left behind, if it has not exited yet
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
    text = log.read_text(errors="replace")
    assert proc.returncode == -signal.SIGKILL, f"{job} was not killed at {spec}: {text[-3000:]}"
    assert f"failpoint {step} fires: kill" in text, text[-3000:]
