"""The one Spark session factory: every job, `jetlake sql` and the tests get their session here.

Why one place:
- Delta: the session needs Delta's SQL extension and catalog, and Delta's jars on the classpath.
  The jars are fetched once by `scripts/setup.sh` into `.venv/jars` and passed with `spark.jars`,
  so no session resolves packages from the network at run time.
- Loopback: the driver binds to 127.0.0.1 (`SPARK_LOCAL_IP`, `spark.driver.host`,
  `spark.driver.bindAddress`); the machines this runs on have no other usable interface. Only a
  driver whose executors run elsewhere (the scheduler in docker-compose.yml) sets
  `JETLAKE_SPARK_DRIVER_HOST` to the name the executors reach it by; it then binds to all interfaces.
- Small machines: no UI, few shuffle partitions, 2 GB driver (`JETLAKE_SPARK_DRIVER_MEMORY`; executors
  on a cluster take Spark's default or `JETLAKE_SPARK_EXECUTOR_MEMORY`); the jobs rewrite a few files at a time.
- Small row groups (8 MiB) in the files the jobs write, like the flusher's: reads by sequence stay cheap.
- Erasure vacuums with zero retention, so Delta's retention-duration check is off; the jobs decide
  what is old enough, not Spark's default of seven days.
- Deletion vectors stay off by default: delta-rs and Spark must both keep writing the same tables.
- Timestamps: every session writes `TIMESTAMP_MICROS` (delta-rs's and the engine's type), not INT96.

The master is `local[*]` unless given or set in `JETLAKE_SPARK_MASTER`; a `spark://…`, YARN or k8s
master works unchanged: `spark.jars` (Delta's, and S3A's for an `s3://` warehouse) are served by the
driver to every executor, so the workers need nothing but Spark and Java.

An `s3://` warehouse adds Hadoop's S3A: its jars (`scripts/setup.sh --s3-spark` fetches them into
`.venv/jars-s3`, apart, as the AWS SDK bundle is ~690 MB) and the `fs.s3a.*` settings from the AWS
variables. Spark addresses the tables as `s3a://…`; `engine.store.objectstore.location` maps the
URIs and holds the settings, so delta-rs and Spark cannot drift apart.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from engine.store.objectstore.location import WarehouseLocation

MASTER_ENV = "JETLAKE_SPARK_MASTER"
JARS_ENV = "JETLAKE_SPARK_JARS"
S3_JARS_ENV = "JETLAKE_SPARK_S3_JARS"
DRIVER_HOST_ENV = "JETLAKE_SPARK_DRIVER_HOST"
DRIVER_MEMORY_ENV = "JETLAKE_SPARK_DRIVER_MEMORY"
EXECUTOR_MEMORY_ENV = "JETLAKE_SPARK_EXECUTOR_MEMORY"
DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"
REQUIRED_JARS = ("delta-spark_", "delta-storage-")
REQUIRED_S3_JARS = ("hadoop-aws-", "bundle-", "analyticsaccelerator-s3-")

_REPO_ROOT = Path(__file__).resolve().parents[1]

# Runtime SQL settings every job relies on; set at creation and again by each job on the session it
# is given (a session made elsewhere, or changed since, must not decide how a job writes): timestamps
# as INT64 microseconds with UTC semantics, the type delta-rs writes and the engine reads, never
# Spark's legacy INT96.
# Parquet row groups as the engine's flusher writes them (engine/store/flush_commits.py's ROW_GROUP_ROWS): at
# most 1,024 rows, so a read by sequence or by subject of a compacted or rewritten file decodes as
# little as one of a fresh file (parquet-java counts rows only with `block.row.count.limit`; the byte
# bound below still cuts groups of large messages); no statistics on payloads (a group's footer entry
# would carry two of them, and nothing prunes by them).
# A job's session copies these into the Hadoop configuration its writes see; a new session gets them
# as `spark.hadoop.*` too.
ROW_GROUP_ROWS = 1024
PARQUET_WRITE_SETTINGS: dict[str, str] = {
    "parquet.block.row.count.limit": str(ROW_GROUP_ROWS),
    "parquet.column.statistics.enabled#data": "false",
}
SESSION_SETTINGS: dict[str, str] = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    **PARQUET_WRITE_SETTINGS,
}

_SETTINGS: dict[str, str] = {
    **{key: value for key, value in SESSION_SETTINGS.items() if key.startswith("spark.")},
    **{f"spark.hadoop.{key}": value for key, value in PARQUET_WRITE_SETTINGS.items()},
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.driver.memory": "2g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
    # Row groups of ~8 MiB (Parquet's default is 128 MiB): a file compaction writes still lets the
    # engine's read by sequence decode one small row group, found by its `seq` statistics.
    "spark.hadoop.parquet.block.size": str(8 * 1024 * 1024),
}


def spark_session(master: str | None = None, app_name: str = "jetlake",
                  warehouse: str | Path | None = None) -> SparkSession:
    """Return a Spark session with Delta configured (an existing one in this process is reused).

    Args:
        master: Spark master URL; defaults to `$JETLAKE_SPARK_MASTER`, then `local[*]`.
        app_name: the application name shown by the Spark master.
        warehouse: the warehouse the session works on; an `s3://` one adds S3A (jars and settings).
            Jars are fixed when the JVM starts: a session reused from before has S3A only if it had.

    Raises:
        FileNotFoundError: Delta's jars, or for an `s3://` warehouse the S3A jars, are missing
            (run `scripts/setup.sh`, or `scripts/setup.sh --s3-spark`).
    """
    s3a = s3a_conf(warehouse)
    jars = delta_jars() + (s3a_jars() if s3a else [])
    driver_host = os.environ.get(DRIVER_HOST_ENV)
    if not driver_host:
        # Read by the JVM's launcher and Spark's own address lookup: must be set before the JVM starts.
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    # Python workers run this interpreter, the one with pyarrow and the project installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    builder = SparkSession.builder.master(master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER).appName(app_name)
    sizes = (("spark.driver.memory", DRIVER_MEMORY_ENV), ("spark.executor.memory", EXECUTOR_MEMORY_ENV))
    memory = {name: os.environ[env] for name, env in sizes if os.environ.get(env)}
    for key, value in {**_SETTINGS, **s3a, **memory}.items():
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


def s3a_conf(warehouse: str | Path | None) -> dict[str, str]:
    """Spark's S3A settings for an `s3://` warehouse (endpoint and keys from the AWS variables); {} otherwise."""
    if warehouse is None:
        return {}
    location = WarehouseLocation.parse(warehouse)
    return location.s3.spark_conf() if location.s3 is not None else {}


def s3a_jars() -> list[Path]:
    """hadoop-aws and the AWS SDK: from `$JETLAKE_SPARK_S3_JARS`, else the venv's `jars-s3/`."""
    override = os.environ.get(S3_JARS_ENV)
    candidates = [Path(override)] if override else [Path(sys.prefix) / "jars-s3", _REPO_ROOT / ".venv" / "jars-s3"]
    for folder in candidates:
        jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
        if all(any(jar.name.startswith(prefix) for jar in jars) for prefix in REQUIRED_S3_JARS):
            return jars
    searched = ", ".join(str(folder) for folder in candidates)
    raise FileNotFoundError(
        f"Spark's S3A jars (hadoop-aws, the AWS SDK bundle) not found in {searched}; "
        "run scripts/setup.sh --s3-spark to fetch them"
    )
