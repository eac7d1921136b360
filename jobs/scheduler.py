"""Running the maintenance jobs: once (`jetlake jobs run`) or on intervals (`jetlake scheduler`).

Each job is a module `jobs.<name>` with `run(spark, layout, **options) -> dict[str, int | float]`
(the figures it logs). Modules are imported when first run; a job whose module is missing is skipped
with a log line, so a scheduler keeps running the others.

The scheduler runs the jobs one at a time in one Spark session (they rewrite the same tables; the
commit lease would serialise them anyway), each on its own interval:

| job | flag | environment | default |
|---|---|---|---|
| retention | `--retention-interval S` | `JETLAKE_RETENTION_INTERVAL` | 300 s |
| erase | `--erase-interval S` | `JETLAKE_ERASE_INTERVAL` | 60 s |
| compact | `--compact-interval S` | `JETLAKE_COMPACT_INTERVAL` | 3600 s |

A flag wins over the environment; 0 turns a job off. Every job runs once at start (or after
`--start-delay S` / `JETLAKE_SCHEDULER_START_DELAY`), then every interval after its previous run *started* (a run longer than its interval is followed by the next at
once, never by a backlog). A failing run is logged with its traceback and retried at its next turn;
the loop itself stops only when asked (`stop()`, SIGTERM/SIGINT in `jetlake scheduler`), after
`max_runs` job runs, or after `duration` seconds — it is woken within a second of a stop request
between runs; a job already running finishes first (every job is safe to kill, so a kill is fine too).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.store.layout import Layout, account_names

log = logging.getLogger("jetlake.scheduler")

JOBS = ("retention", "erase", "compact")  # the order `all` runs them in, and ties on the schedule
DEFAULT_INTERVALS: dict[str, float] = {"retention": 300.0, "compact": 3600.0, "erase": 60.0}
ENV = {name: f"JETLAKE_{name.upper()}_INTERVAL" for name in JOBS}
START_DELAY_ENV = "JETLAKE_SCHEDULER_START_DELAY"

Figures = dict[str, int | float]


class JobMissing(LookupError):
    """The job's module is not there (not installed in this version)."""


def load_job(name: str) -> Callable[..., Figures]:
    """`jobs.<name>.run`, imported on first use; `JobMissing` if the module does not exist."""
    if name not in JOBS:
        raise ValueError(f"unknown job {name!r}; one of {', '.join(JOBS)}")
    module_name = f"jobs.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise JobMissing(f"job {name}: module {module_name} is not there") from None
        raise
    run = getattr(module, "run", None)
    if not callable(run):
        raise JobMissing(f"job {name}: {module_name} has no run(spark, layout, **options)")
    return run  # type: ignore[no-any-return]


S3_JOBS: tuple[str, ...] = JOBS  # the jobs that run on an s3:// warehouse: all of them, through the object store


def run_job(spark: Any, layout: Layout, name: str, **options: Any) -> Figures:
    """Runs one job now and logs its figures and time; exceptions (and `JobMissing`) propagate."""
    if layout.is_s3 and name not in S3_JOBS:
        raise JobMissing(f"job {name}: not available on an object-storage warehouse yet ({layout})")
    run = load_job(name)
    log.info("job %s: started on %s", name, layout)
    started = time.monotonic()
    figures = dict(run(spark, layout, **options) or {})
    seconds = time.monotonic() - started
    log.info("job %s: done in %.2fs: %s", name, seconds, _format(figures))
    figures.setdefault("seconds", round(seconds, 3))
    return figures


def start_delay_from(flag: float | None, environ: Mapping[str, str] | None = None) -> float:
    """Seconds before the first runs: the flag, else `JETLAKE_SCHEDULER_START_DELAY`, else 0."""
    environ = os.environ if environ is None else environ
    if flag is None and environ.get(START_DELAY_ENV, "").strip():
        try:
            flag = float(environ[START_DELAY_ENV])
        except ValueError:
            raise ValueError(f"{START_DELAY_ENV}={environ[START_DELAY_ENV]!r} is not a number of seconds") from None
    if flag is not None and flag < 0:
        raise ValueError(f"the start delay must be >= 0, not {flag}")
    return float(flag or 0.0)


def intervals_from(flags: Mapping[str, float | None], environ: Mapping[str, str] | None = None) -> dict[str, float]:
    """Each job's interval in seconds: its flag if given, else its environment variable, else the default."""
    environ = os.environ if environ is None else environ
    out: dict[str, float] = {}
    for name in JOBS:
        value = flags.get(name)
        if value is None and environ.get(ENV[name], "").strip():
            try:
                value = float(environ[ENV[name]])
            except ValueError:
                raise ValueError(f"{ENV[name]}={environ[ENV[name]]!r} is not a number of seconds") from None
        interval = DEFAULT_INTERVALS[name] if value is None else float(value)
        if interval < 0:
            raise ValueError(f"the {name} interval must be >= 0 (0 turns the job off), not {interval}")
        out[name] = interval
    return out


@dataclass
class Scheduler:
    """Runs the jobs on their intervals in one Spark session until stopped.

    `spark` is a session or a factory called once, at the first run (so a scheduler that is stopped
    before its first job never starts a JVM). `clock` and `sleep` are for tests.
    """

    spark: Any
    layout: Layout
    intervals: Mapping[str, float]
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    max_runs: int | None = None
    duration: float | None = None
    start_delay: float = 0.0
    all_accounts: bool = False  # every account of the warehouse, not only the layout's
    clock: Callable[[], float] = time.monotonic
    runs: int = 0
    failures: int = 0
    history: list[tuple[str, str, Figures | str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _session: Any = None
    _missing: set[str] = field(default_factory=set)

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run_forever(self) -> int:
        """The loop; returns the number of failed runs."""
        active = {name: every for name, every in self.intervals.items() if every > 0}
        if not active:
            log.warning("scheduler: every job is off; nothing to do")
            return 0
        log.info("scheduler on %s: %s%s", self.layout,
                 ", ".join(f"{name} every {every:g}s" for name, every in active.items()),
                 f"; first runs in {self.start_delay:g}s" if self.start_delay else "")
        started = self.clock()
        due = {name: started + self.start_delay for name in active}
        while not self._stop.is_set():
            now = self.clock()
            if self.duration is not None and now - started >= self.duration:
                log.info("scheduler: ran for %.0fs, stopping", now - started)
                break
            ready = [name for name in JOBS if name in due and due[name] <= now]
            if not ready:
                wait = min(due.values()) - now
                if self.duration is not None:
                    wait = min(wait, self.duration - (now - started))
                self._stop.wait(max(0.0, min(wait, 1.0)))
                continue
            for name in ready:
                if self._stop.is_set():
                    break
                due[name] = self.clock() + active[name]
                self._run_one(name)
                if name in self._missing:
                    del due[name]
                if self.max_runs is not None and self.runs >= self.max_runs:
                    log.info("scheduler: %d runs done, stopping", self.runs)
                    self._stop.set()
            if not due:
                log.warning("scheduler: no job left to run")
                break
        self._close()
        log.info("scheduler stopped: %d runs, %d failed", self.runs, self.failures)
        return self.failures

    def _layouts(self) -> list[Layout]:
        """The accounts a job runs on: with `all_accounts`, every account that has a tree in the warehouse."""
        if not self.all_accounts:
            return [self.layout]
        names = account_names(self.layout.warehouse)
        wal_dir = self.layout.wal_dir_root.parent
        return [Layout(self.layout.location, name, wal_dir) for name in names] or [self.layout]

    def _run_one(self, name: str) -> None:
        for layout in self._layouts():
            self._run_on(name, layout)

    def _run_on(self, name: str, layout: Layout) -> None:
        try:
            figures = run_job(self._spark(), layout, name, **dict(self.options.get(name, {})))
        except JobMissing as exc:
            log.warning("scheduler: %s; skipping it", exc)
            self._missing.add(name)
            self.history.append((name, "missing", str(exc)))
            return
        except Exception as exc:  # one failure must not stop the loop: log it, try again next turn
            self.runs += 1
            self.failures += 1
            self.history.append((name, "failed", f"{type(exc).__name__}: {exc}"))
            log.exception("job %s failed; next try in %gs", name, self.intervals[name])
            self._drop_dead_session()
            return
        self.runs += 1
        self.history.append((name, "ok", figures))

    def _spark(self) -> Any:
        if self._session is None:
            self._session = self.spark() if callable(self.spark) else self.spark
        return self._session

    def _drop_dead_session(self) -> None:
        """After a failure: if the session's JVM side is gone, make a new one next time (factories only)."""
        session = self._session
        if session is None or not callable(self.spark):
            return
        try:
            context = session.sparkContext
        except Exception:  # not a SparkSession we can inspect: keep it
            return
        jsc = getattr(context, "_jsc", None)
        try:
            dead = jsc is None or bool(jsc.sc().isStopped())
        except Exception:  # the JVM does not answer
            dead = True
        if dead:
            log.warning("scheduler: the Spark session is gone; a new one starts with the next job")
            self._session = None

    def _close(self) -> None:
        # Only a session this scheduler made is stopped; a session handed in belongs to the caller.
        if self._session is not None and callable(self.spark):
            try:
                self._session.stop()
            except Exception:
                log.exception("stopping the Spark session failed")
        self._session = None


def _format(figures: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in figures.items()) or "no figures"
