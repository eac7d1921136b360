from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from engine import EngineOptions, JetStream, ManualClock
from jobs.spark import spark_session
from tests import cpu_profile
from tests.gateway import Gateway
from tests.groups import ENV, SHORT_JVM, keep_group
from tests.s3 import S3Server, versitygw_binary


def pytest_configure(config: pytest.Config) -> None:
    """With $JETLAKE_TEST_CPU=path, each test's CPU (its processes' too) is written there (tests/cpu_profile.py)."""
    cpu_profile.register(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With $JETLAKE_TEST_GROUP set (by scripts/test.py), only that group's tests run."""
    group = os.environ.get(ENV)
    if group:
        keep_group(config, items, group)


@pytest.fixture(scope="session")
def shared_spark() -> Iterator[SparkSession]:
    """One Spark session for the whole run (a JVM start costs seconds); tests get it through `spark`.
    It lives the whole run, so it gets the full JIT, not the short-lived JVMs' options of scripts/test.py."""
    short = os.environ.get(SHORT_JVM)
    if short and os.environ.get("JAVA_TOOL_OPTIONS") == short:
        del os.environ["JAVA_TOOL_OPTIONS"]
    try:
        session = spark_session("local[2]", "jetlake-tests")
    finally:
        if short:
            os.environ["JAVA_TOOL_OPTIONS"] = short
    yield session
    session.stop()


@pytest.fixture
def spark(shared_spark: SparkSession) -> Iterator[SparkSession]:
    """The shared session, given back as it was handed over: the settings a test (or a job it ran)
    changed return to their values, those it added are unset, the temporary views it registered go.
    Jobs set what they need on the session they are given; a test never inherits another's session."""
    before = session_state(shared_spark)
    yield shared_spark
    restore_session(shared_spark, before)


SessionState = tuple[dict[str, str], frozenset[str]]


def session_state(spark: SparkSession) -> SessionState:
    """A session's settings and temporary views."""
    views = frozenset(t.name for t in spark.catalog.listTables() if t.isTemporary)
    return dict(spark.conf.getAll), views


def restore_session(spark: SparkSession, state: SessionState) -> None:
    settings, views = state
    now = dict(spark.conf.getAll)
    for key in now.keys() - settings.keys():
        if spark.conf.isModifiable(key):
            spark.conf.unset(key)
    for key, value in settings.items():
        if now.get(key) != value and spark.conf.isModifiable(key):
            spark.conf.set(key, value)
    for name in {t.name for t in spark.catalog.listTables() if t.isTemporary} - views:
        spark.catalog.dropTempView(name)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    path = tmp_path / "warehouse"
    path.mkdir()
    return path


@pytest.fixture
def js(warehouse: Path, clock: ManualClock) -> Iterator[JetStream]:
    """An engine on a fresh warehouse with a hand-moved clock and no background flusher."""
    engine = JetStream(warehouse, EngineOptions(), clock=clock)
    engine.open(start_flusher=False)
    yield engine
    engine.close()


def reopen(js: JetStream, clock: ManualClock, **options: int) -> JetStream:
    """Closes an engine and opens a new one on its warehouse: a restart."""
    js.close()
    again = JetStream(js.layout.warehouse, EngineOptions(**options), clock=clock)
    again.open(start_flusher=False)
    return again


@pytest.fixture
def engine(js: JetStream) -> Iterator[list[JetStream]]:
    """The engine in a box, so a test can swap it for a reopened one and still have it closed."""
    box = [js]
    yield box
    if box[0] is not js:
        box[0].close()


@pytest.fixture
def gateway(warehouse: Path) -> Iterator[Gateway]:
    """A real `jetlake serve` on loopback, on a fresh warehouse."""
    gw = Gateway(warehouse, "--flush-interval", "0.2").start()
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3-compatible server (versitygw) on loopback for the whole session."""
    binary = versitygw_binary()
    if binary is None:
        pytest.skip("the S3 server (versitygw) is not installed: scripts/setup.sh builds it into .venv/bin "
                    "when Go is on PATH")
    server = S3Server(tmp_path_factory.mktemp("s3-data"), binary).start()
    yield server
    server.stop()
