"""The class-data archive (JDK CDS) of the short-lived JVMs the tests start: made once, kept in the venv.

Each `jetlake jobs run` starts two JVMs, Spark's launcher and the driver; mapping the classes they load
from an archive instead of reading and parsing the jars takes a driver's start from about 14.5 to 8 s
of CPU on two cores. `archive_options()` returns the JVM options that use the archives, dumping them
first if missing (one job run on an empty warehouse), or None where they cannot be made.

Safe on any clone, since a JVM must never print on stdout (tests read a job's JSON there):
- the archives are named for the JDK, pyspark and its jars, so another install never maps them;
- unified logging goes to stderr and only warnings (`-Xlog:disable -Xlog:all=warning:stderr`): the JDK
  prints a class-path mismatch on stdout by default, and Spark's launcher, whose stdout is the
  command it builds, would print it for the driver's archive; the launcher gets its own archive
  (`SPARK_LAUNCHER_OPTS`), for its own class path;
- a dump is written in scratch and moved in whole (`os.replace`) once it mapped with its checksums
  verified: a truncated archive crashes JDK 17 rather than being ignored;
- `-Xshare:auto`: an archive that does not match the JVM's class path is skipped and the JVM loads
  its classes from the jars, as without one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

LOGGING = "-Xlog:disable -Xlog:all=warning:stderr"
LAUNCHER_ENV = "SPARK_LAUNCHER_OPTS"
_DUMP_TIMEOUT = 600.0


def archive_options(short_jvm: str, scratch: Path, root: Path) -> tuple[str, str] | None:
    """(JAVA_TOOL_OPTIONS, SPARK_LAUNCHER_OPTS) for the short JVMs, with their archives; None (and a line
    saying why) when they cannot be made: the JVMs then start as before."""
    found = _spark_and_java()
    if found is None:
        return None
    spark_home, java = found
    folder = Path(sys.prefix) / "jvm-cds"  # in the virtualenv: later runs reuse it
    driver, launcher = (folder / f"{name}-{_key(spark_home, java, short_jvm)}.jsa" for name in ("driver", "launcher"))
    if not (driver.exists() and launcher.exists()):
        print("test: dumping the short JVMs' class archives (once, kept in the venv's jvm-cds/)", flush=True)
        reason = _dump(short_jvm, scratch, root, java, {driver: scratch / "driver.jsa", launcher: scratch / "launcher.jsa"})
        if reason:
            print(f"test: no class archive ({reason}); the JVMs start without one", flush=True)
            return None
    return (f"{short_jvm} -Xshare:auto {LOGGING} -XX:SharedArchiveFile={driver}",
            f"-Xshare:auto {LOGGING} -XX:SharedArchiveFile={launcher}")


def _spark_and_java() -> tuple[Path, Path] | None:
    try:
        import pyspark
    except ImportError:
        return None
    home = Path(os.environ.get("JAVA_HOME", ""), "bin")
    java = shutil.which("java", path=f"{home}{os.pathsep}{os.environ.get('PATH', '')}")
    return (Path(pyspark.__file__).parent, Path(os.path.realpath(java))) if java else None


def _key(spark_home: Path, java: Path, short_jvm: str) -> str:
    """What the archives depend on: the JDK binary, Spark's jars (the class path) and the JVM options."""
    jars = sorted(f"{jar.name}:{jar.stat().st_size}" for jar in (spark_home / "jars").glob("*.jar"))
    parts = [str(java), str(java.stat().st_mtime_ns), str(spark_home), short_jvm, *jars]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _dump(short_jvm: str, scratch: Path, root: Path, java: Path, targets: dict[Path, Path]) -> str | None:
    """Runs one job with both JVMs dumping their classes at exit; moves the verified archives in place.
    Returns why it failed, or None."""
    (driver, dumped_driver), (launcher, dumped_launcher) = targets.items()
    warehouse = scratch / "cds-warehouse"
    warehouse.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(root), "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
           "JAVA_TOOL_OPTIONS": f"{short_jvm} {LOGGING} -XX:ArchiveClassesAtExit={dumped_driver}",
           LAUNCHER_ENV: f"{LOGGING} -XX:ArchiveClassesAtExit={dumped_launcher}"}  # after, so it wins for the launcher
    command = [str(Path(sys.executable).parent / "jetlake"), "jobs", "run", "retention", "--warehouse", str(warehouse)]
    job = None
    try:
        # pyspark leaves its JVM to exit after the Python process, and the JVM dumps as it exits: wait
        # for the whole process group
        job = subprocess.Popen(command, env=env, cwd=root, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        code = job.wait(timeout=_DUMP_TIMEOUT)
        deadline = time.monotonic() + _DUMP_TIMEOUT
        while _group_alive(job.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    finally:
        if job is not None and _group_alive(job.pid):
            os.killpg(job.pid, signal.SIGKILL)
    if code != 0:
        return f"the dumping job exited with {code}"
    for dumped in (dumped_driver, dumped_launcher):
        if not dumped.exists() or not _maps(java, dumped):
            return f"{dumped.name} was not dumped whole"
    driver.parent.mkdir(parents=True, exist_ok=True)
    for final, dumped in targets.items():
        os.replace(dumped, final)  # atomic: a run beside this one sees a whole archive or none
    return None


def _maps(java: Path, archive: Path) -> bool:
    """Whether a JVM maps `archive` with its regions' checksums right (a broken one aborts it)."""
    check = [str(java), "-XX:+VerifySharedSpaces", "-Xshare:auto", *LOGGING.split(), f"-XX:SharedArchiveFile={archive}", "-version"]
    env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
    return subprocess.run(check, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120).returncode == 0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
