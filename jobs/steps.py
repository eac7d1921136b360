"""Named steps of the maintenance jobs, where a test can stop a job in order to kill it.

Each job calls `reached("<job>.<step>")` where a kill would cut its work in two (before a rewrite,
after it, between the erase job's property changes and its cleanup). When `JETLAKE_JOBS_PAUSE_AT`
names the step, the job logs `paused at <step>` and waits there until it is killed: a test kills
the `jetlake jobs run` process with SIGKILL at that point and checks that a rerun reaches the same
end state. Unset (always, outside tests) a step is only logged at debug level.
"""

from __future__ import annotations

import logging
import os
import time

PAUSE_ENV = "JETLAKE_JOBS_PAUSE_AT"
log = logging.getLogger("jetlake.jobs")


def reached(step: str) -> None:
    if os.environ.get(PAUSE_ENV) != step:
        log.debug("step %s", step)
        return
    log.warning("paused at %s (%s is set): waiting to be killed", step, PAUSE_ENV)
    for handler in logging.getLogger().handlers:
        handler.flush()
    while True:
        time.sleep(60)
