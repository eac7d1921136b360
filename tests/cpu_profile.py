"""CPU per test, independent of the machine's load: `JETLAKE_TEST_CPU=path` turns it on (tests/conftest.py).

A test's CPU is what the pytest process and every process under it spent during its set-up, call and
tear-down: `getrusage` of the process itself and of the children it waited for (the gateways a test
starts and stops, `jetlake jobs run` and its JVM), plus utime+stime of the processes still running
under it, read from /proc (the run's Spark JVM, which lives the whole run; servers a fixture keeps).
Session and module fixtures are charged to the first test that asks for them (its set-up column).
Wall time is kept beside it only to show how much the load stretched the run.

At the end the file at `path` gets one JSON object: per test and per module (CPU, set-up CPU, wall),
ranked by CPU, with the total; the terminal gets the top modules.
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "JETLAKE_TEST_CPU"
TOP = 15
_TICK = os.sysconf("SC_CLK_TCK")
_PHASES = ("setup", "call", "teardown")


class ProcessTree:
    """The CPU of this process and of every process it started, including those that outlive their
    parent: a `jetlake jobs run`'s JVM is left to exit on its own after the Python process (pyspark does
    not wait for it), so it is reaped by init and its CPU never reaches RUSAGE_CHILDREN. A thread samples
    /proc every `interval` seconds; a process seen under this one keeps being followed after it is
    reparented elsewhere, and what it had spent when last seen counts once it is gone (at most one
    interval of its CPU is missed). The sampler's own CPU is left out."""

    def __init__(self, interval: float = 0.25) -> None:
        self.me = os.getpid()
        self.interval = interval
        self.lock = threading.Lock()
        self.known: set[tuple[int, int]] = set()  # (pid, start) of the processes seen under this one
        self.escaped: dict[tuple[int, int], tuple[int, int]] = {}  # those reparented elsewhere -> (ppid, ticks)
        self.frozen = 0  # ticks of escaped processes gone, reaped outside this tree
        self.live = 0  # ticks of the processes under this one now
        self.sampler_cpu = 0.0
        self.stopped = threading.Event()
        self.sample()
        self.thread = threading.Thread(target=self._run, name="cpu-profile", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()

    def sample(self) -> None:
        began = time.thread_time()
        with self.lock:
            procs = _processes()
            parents = {pid: ppid for (pid, _), (ppid, _, _) in procs.items()}
            ours: set[int] = {self.me}
            live = 0
            for (pid, start), (ppid, ticks, _) in sorted(procs.items(), key=lambda kv: kv[1][2]):
                if pid == self.me:
                    continue
                if ppid in ours or (pid, start) in self.known:
                    ours.add(pid)
                    self.known.add((pid, start))
                    if _descends(pid, self.me, parents):
                        live += ticks
                    else:
                        self.escaped[(pid, start)] = (ppid, ticks)
            # followed processes once seen under this one: those gone count as last seen, unless the
            # parent that reaped them is followed (then they are in its cstime)
            for key, (ppid, ticks) in list(self.escaped.items()):
                if key in procs:
                    continue
                del self.escaped[key]
                if ppid not in ours:
                    self.frozen += ticks
            self.known &= procs.keys()
            self.live = live
            self.sampler_cpu += time.thread_time() - began

    def cpu_seconds(self) -> float:
        """CPU spent so far by this process and everything under it, less the sampler's."""
        self.sample()
        own = resource.getrusage(resource.RUSAGE_SELF)
        waited = resource.getrusage(resource.RUSAGE_CHILDREN)
        with self.lock:
            ticks = self.live + self.frozen + sum(t for _, t in self.escaped.values())
            return (own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime + ticks / _TICK
                    - self.sampler_cpu)


def _processes() -> dict[tuple[int, int], tuple[int, int, int]]:
    """(pid, start time) -> (ppid, utime+stime+cutime+cstime ticks, start time) of every process."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        start = int(fields[19])
        out[(int(entry.name), start)] = (int(fields[1]), sum(int(f) for f in fields[11:15]), start)
    return out


def _descends(pid: int, ancestor: int, parents: dict[int, int]) -> bool:
    for _ in range(64):
        pid = parents.get(pid, 0)
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


class CpuProfile:
    """Records each test's CPU per phase and writes the ranking at the end of the session."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tests: dict[str, dict[str, float]] = {}
        self.tree = ProcessTree()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        yield from self._measure(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        yield from self._measure(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        yield from self._measure(item, "teardown")

    def _measure(self, item: pytest.Item, phase: str) -> Iterator[None]:
        cpu, wall = self.tree.cpu_seconds(), time.monotonic()
        yield
        record = self.tests.setdefault(item.nodeid, {"cpu": 0.0, "wall": 0.0, **{p: 0.0 for p in _PHASES}})
        spent = self.tree.cpu_seconds() - cpu
        record[phase] += spent
        record["cpu"] += spent
        record["wall"] += time.monotonic() - wall
        if phase == "teardown":
            self._write()  # after every test, so that a run stopped midway leaves its figures

    def report(self) -> dict[str, object]:
        modules: dict[str, dict[str, float]] = {}
        for nodeid, record in self.tests.items():
            module = modules.setdefault(nodeid.split("::")[0], {"cpu": 0.0, "setup": 0.0, "wall": 0.0, "tests": 0})
            for key in ("cpu", "setup", "wall"):
                module[key] += record[key]
            module["tests"] += 1
        rank = lambda rows: dict(sorted(((k, {f: round(v, 2) for f, v in r.items()}) for k, r in rows.items()),  # noqa: E731
                                        key=lambda kv: -kv[1]["cpu"]))
        return {"total_cpu": round(sum(r["cpu"] for r in self.tests.values()), 1),
                "modules": rank(modules), "tests": rank(self.tests)}

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.report(), indent=1) + "\n")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.tree.stop()
        self._write()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        report = self.report()
        terminalreporter.write_sep("=", f"CPU per module (total {report['total_cpu']} s; all in {self.path})")
        for module, row in list(report["modules"].items())[:TOP]:  # type: ignore[union-attr]
            terminalreporter.write_line(f"{row['cpu']:8.1f} s cpu {row['setup']:7.1f} s set-up "
                                        f"{row['wall']:8.1f} s wall {int(row['tests']):4d} tests  {module}")


def register(config: pytest.Config) -> None:
    """Turns the profile on when $JETLAKE_TEST_CPU names the file to write."""
    path = os.environ.get(ENV)
    if path:
        config.pluginmanager.register(CpuProfile(Path(path).resolve()), "jetlake-cpu-profile")
