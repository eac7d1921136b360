"""The one Spark session factory: every job, `jetlake sql` and the tests get their session here.

Why one place:
- Delta: the session needs Delta's SQL extension and catalog, and Delta's jars on the classpath.
  The jars are fetched once by `scripts/setup.sh` into `.venv/jars` and passed with `spark.jars`,
  so no session resolves packages from the network at run time.
- Loopback: the driver binds to 127.0.0.1 (`SPARK_LOCAL_IP`, `spark.driver.host`,
  `spark.driver.bindAddress`); the machines this runs on have no other usable interface. Only a
  driver whose executors run elsewhere (the scheduler in docker-compose.yml) sets
  `JETLAKE_SPARK_DRIVER_HOST` to the name the executors reach it by; it then binds to all interfaces.
- Small machines: no UI, few shuffle partitions, 2 GB driver; the jobs rewrite a few files at a time.
- Erasure vacuums with zero retention, so Delta's retention-duration check is off; the jobs decide
  what is old enough, not Spark's default of seven days.
- Deletion vectors stay off by default: delta-rs and Spark must both keep writing the same tables.

The master is `local[*]` unless given or set in `JETLAKE_SPARK_MASTER`; a `spark://…`, YARN or k8s
master works unchanged.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

MASTER_ENV = "JETLAKE_SPARK_MASTER"
JARS_ENV = "JETLAKE_SPARK_JARS"
DRIVER_HOST_ENV = "JETLAKE_SPARK_DRIVER_HOST"
DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"
REQUIRED_JARS = ("delta-spark_", "delta-storage-")

_REPO_ROOT = Path(__file__).resolve().parents[1]

_SETTINGS: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.driver.memory": "2g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
}


def spark_session(master: str | None = None, app_name: str = "jetlake") -> SparkSession:
    """Return a Spark session with Delta configured (an existing one in this process is reused).

    Args:
        master: Spark master URL; defaults to `$JETLAKE_SPARK_MASTER`, then `local[*]`.
        app_name: the application name shown by the Spark master.

    Raises:
        FileNotFoundError: Delta's jars are missing (run `scripts/setup.sh`).
    """
    jars = delta_jars()
    driver_host = os.environ.get(DRIVER_HOST_ENV)
    if not driver_host:
        # Read by the JVM's launcher and Spark's own address lookup: must be set before the JVM starts.
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    # Python workers run this interpreter, the one with pyarrow and the project installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    builder = SparkSession.builder.master(master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER).appName(app_name)
    for key, value in _SETTINGS.items():
        builder = builder.config(key, value)
    builder = builder.config("spark.driver.host", driver_host or LOOPBACK)
    builder = builder.config("spark.driver.bindAddress", "0.0.0.0" if driver_host else LOOPBACK)
    builder = builder.config("spark.jars", ",".join(str(jar) for jar in jars))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def delta_jars() -> list[Path]:
    """Delta's jars: from `$JETLAKE_SPARK_JARS` if set, else the venv's `jars/`, else `<repo>/.venv/jars`."""
    override = os.environ.get(JARS_ENV)
    candidates = [Path(override)] if override else [Path(sys.prefix) / "jars", _REPO_ROOT / ".venv" / "jars"]
    for folder in candidates:
        jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
        if all(any(jar.name.startswith(prefix) for jar in jars) for prefix in REQUIRED_JARS):
            return jars
    searched = ", ".join(str(folder) for folder in candidates)
    raise FileNotFoundError(
        f"Delta's jars (delta-spark_2.13, delta-storage) not found in {searched}; run scripts/setup.sh to fetch them"
    )
