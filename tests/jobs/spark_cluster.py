"""A Spark standalone cluster for tests: one master and one worker from the installed pyspark, on
loopback, small (one core, 1 GiB for executors, 256 MiB daemons), stopped by their PIDs.

    with SparkCluster(tmp_path) as cluster:
        run(["jetlake", "jobs", "run", "all", "--master", cluster.url], env=cluster.env)
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import TracebackType

import pyspark

from tests.gateway import free_port

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
START_TIMEOUT = 120.0


class SparkCluster:
    """`spark-class …Master` and `…Worker` as child processes; `env` is what a driver needs beside them."""

    def __init__(self, folder: Path, worker_memory: str = "1g") -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.master_log = folder / "master.log"
        self.worker_log = folder / "worker.log"
        self.worker_memory = worker_memory
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(folder),
                    "SPARK_NO_DAEMONIZE": "1", "SPARK_DAEMON_MEMORY": "256m"}
        self.env.pop("JETLAKE_SPARK_DRIVER_HOST", None)
        self.master: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SparkCluster:
        try:
            self.master = self._start(self.master_log, "org.apache.spark.deploy.master.Master",
                                      "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", "0")
            wait_for_line(self.master_log, "I have been elected leader", self.master)
            self.worker = self._start(self.worker_log, "org.apache.spark.deploy.worker.Worker", self.url,
                                      "--host", "127.0.0.1", "--webui-port", "0", "--cores", "1",
                                      "--memory", self.worker_memory, "--work-dir", str(self.folder / "work"))
            wait_for_line(self.master_log, "Registering worker", self.master)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _start(self, log: Path, main_class: str, *args: str) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen([str(SPARK_CLASS), main_class, *args], stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env)

    def stop(self) -> None:
        """The worker first (it would try to reconnect to a gone master), then the master; by PID."""
        for proc in (self.worker, self.master):
            stop_process(proc)
        self.worker = self.master = None


def wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in (log.read_text(errors="replace") if log.exists() else ""):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[1]} exited with {proc.returncode}: {log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"no {text!r} in {log} after {timeout}s: {log.read_text()[-3000:]}")


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()  # spark-class execs java: this PID is the JVM
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
