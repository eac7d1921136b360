"""Runs the test suite as parallel pytest processes, one per group of tests/groups.py.

    .venv/bin/python scripts/test.py [PYTEST ARGS...]

Each group gets its own --basetemp and log; a line is printed as each group ends (with its pytest
summary), then the log of every group that failed. The exit code is the first failing group's, or 0.
Arguments go to every group (`-k recovery`, `-m "not large"`); a group left with no test (pytest's
exit 5) counts as passed. `JETLAKE_TEST_GROUPS=spark,rest` runs only those groups.

The JVMs the tests start live seconds (each `jetlake jobs run`, Spark's launcher, a standalone
cluster): they run with JIT tier 1 and the serial collector (`JAVA_TOOL_OPTIONS`, unless set), which
start them about 30 % cheaper on two cores; the run's own Spark session, which lives the whole run,
is started without them (tests/conftest.py). They also map the classes Spark loads from class-data
archives, which takes another ~45 % off each start (tests/jvm_archive.py: dumped once into the venv,
with logging on stderr so that nothing reaches a job's stdout); the groups that start no JVM start
first, so the dump runs beside them.
`JETLAKE_TEST_CPU=cpu.json` records each test's CPU, its processes' included, in one file per group
(cpu-spark.json, …; tests/cpu_profile.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cpu_profile import ENV as CPU_PROFILE  # noqa: E402
from tests.groups import ENV, GROUPS, NO_JVM_GROUPS, SHORT_JVM, SHORT_JVM_OPTIONS  # noqa: E402
from tests.jvm_archive import LAUNCHER_ENV, archive_options  # noqa: E402

NO_TESTS = 5
SLOWEST = 5  # each group's slowest tests are printed with its line, to keep the groups balanced


def main(args: list[str]) -> int:
    groups = [g for g in os.environ.get("JETLAKE_TEST_GROUPS", ",".join(GROUPS)).split(",") if g]
    scratch = Path(tempfile.mkdtemp(prefix="jetlake-tests-"))
    started = time.monotonic()
    short_jvm = (SHORT_JVM_OPTIONS, "")
    running = {group: _start(group, args, scratch, short_jvm) for group in groups if group in NO_JVM_GROUPS}
    jvm_groups = [group for group in groups if group not in NO_JVM_GROUPS]
    if jvm_groups and "JAVA_TOOL_OPTIONS" not in os.environ:
        short_jvm = archive_options(SHORT_JVM_OPTIONS, scratch, ROOT) or short_jvm
    running |= {group: _start(group, args, scratch, short_jvm) for group in jvm_groups}
    print(f"test: {len(running)} groups in parallel ({', '.join(running)}); logs in {scratch}", flush=True)
    failed: list[tuple[str, int]] = []
    while running:
        for group, (process, log) in list(running.items()):
            code = process.poll()
            if code is None:
                continue
            del running[group]
            passed = code in (0, NO_TESTS)
            print(f"test: {group} {'passed' if passed else f'FAILED ({code})'} after "
                  f"{time.monotonic() - started:.0f} s: {_summary(log)}", flush=True)
            for line in _slowest(log):
                print(f"test:   {group} {line}", flush=True)
            if not passed:
                failed.append((group, code))
        time.sleep(1)
    for group, _ in failed:
        print(f"\n===== {group} =====\n{(scratch / f'{group}.log').read_text(errors='replace')}", flush=True)
    return failed[0][1] if failed else 0


def _start(group: str, args: list[str], scratch: Path,
           short_jvm: tuple[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    """Starts a group's pytest; `short_jvm` is (JAVA_TOOL_OPTIONS, SPARK_LAUNCHER_OPTS) for the JVMs it starts."""
    log = scratch / f"{group}.log"
    env = {**os.environ, ENV: group, "PYTHONPATH": _pythonpath()}
    if env.get(CPU_PROFILE):  # one file per group: cpu.json -> cpu-spark.json, …
        profile = Path(env[CPU_PROFILE])
        env[CPU_PROFILE] = str(profile.with_name(f"{profile.stem}-{group}{profile.suffix}"))
    if "JAVA_TOOL_OPTIONS" not in env:
        env["JAVA_TOOL_OPTIONS"] = env[SHORT_JVM] = short_jvm[0]
        if short_jvm[1] and LAUNCHER_ENV not in env:
            env[LAUNCHER_ENV] = short_jvm[1]
    command = [sys.executable, "-m", "pytest", "-q", f"--durations={SLOWEST}", f"--basetemp={scratch / group}", *args]
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT), log


def _pythonpath() -> str:
    existing = os.environ.get("PYTHONPATH")
    return f"{ROOT}{os.pathsep}{existing}" if existing else str(ROOT)


def _summary(log: Path) -> str:
    """pytest's last line (`N passed, M failed in S s`)."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else "(no output)"


def _slowest(log: Path) -> list[str]:
    """The `--durations` lines of a group's log (`12.34s call tests/…::test_x`)."""
    lines = log.read_text(errors="replace").splitlines()
    heads = [i for i, line in enumerate(lines) if "slowest" in line and "durations" in line]
    if not heads:
        return []
    return [line.strip() for line in lines[heads[-1] + 1:heads[-1] + 1 + SLOWEST] if line.strip()[:1].isdigit()]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
