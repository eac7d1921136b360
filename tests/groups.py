"""The suite's parallel groups: `scripts/test.py` runs one pytest process per group at once.

Every test belongs to exactly one group, decided here from its path and markers, so the groups
together run the whole suite once. The run's one Spark session lives in one group only; the tests
whose Spark runs in processes of their own, and those that mostly wait on real servers, kills and
timeouts (faults, the NATS door, object storage), run beside it, which is where two cores gain.
"""

from __future__ import annotations

from pathlib import Path

import pytest

GROUPS = ("spark", "jobs", "servers", "rest")
ENV = "JETLAKE_TEST_GROUP"
SHORT_JVM = "JETLAKE_TEST_SHORT_JVM"  # set to JAVA_TOOL_OPTIONS when scripts/test.py chose them
SHORT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
NO_JVM_GROUPS = ("rest",)  # start at once, before the short JVMs' class archive is ready (scripts/test.py)

_TESTS = Path(__file__).parent
_SERVER_PATHS = ("faults", "nats", "test_scale.py", "test_s3_server.py", "test_gateway_on_s3.py",
                 "test_wal_object.py", "test_gateways.py", "test_workers.py", "engine/test_restart_on_s3.py", "engine/test_delta_on_s3.py",
                 "engine/test_object_log.py")
# Spark jobs against the S3 server: mostly waiting on JVM starts and the store, so they run beside the
# jobs group rather than lengthening it (the standalone cluster on S3 stays in `jobs`, which is shorter).
_S3_JOB_PATHS = ("jobs/test_jobs_on_s3.py",)


def group_of(item: pytest.Item) -> str:
    """The group an item runs in: `spark` for the tests on the run's one Spark session, `jobs` for the
    other Spark tests (jobs run as processes of their own: `jetlake jobs run`, the scheduler, a
    standalone cluster), `servers` for the suites of real servers, kills and faults, `rest` for the others."""
    relative = Path(item.fspath).resolve().relative_to(_TESTS.resolve()).as_posix()
    if "shared_spark" in getattr(item, "fixturenames", ()):
        return "spark"
    if _under(relative, _S3_JOB_PATHS):
        return "servers"
    if item.get_closest_marker("spark") or _under(relative, ("jobs",)):
        return "jobs"
    if _under(relative, _SERVER_PATHS):
        return "servers"
    return "rest"


def _under(relative: str, prefixes: tuple[str, ...]) -> bool:
    return any(relative == p or relative.startswith(p + "/") for p in prefixes)


def keep_group(config: pytest.Config, items: list[pytest.Item], group: str) -> None:
    """Deselects every item outside `group` (reported as deselected, as `-m` does)."""
    if group not in GROUPS:
        raise pytest.UsageError(f"{ENV}={group!r}: the groups are {', '.join(GROUPS)}")
    kept = [item for item in items if group_of(item) == group]
    dropped = [item for item in items if group_of(item) != group]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
