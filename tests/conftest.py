import time

import pytest


def wait_until(predicate, timeout_s, interval_s=0.2, what="condition"):
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` at the deadline.

    Only for tests of real processes, where there is no clock to drive by hand."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def lingering(swarm, which):
    """The statuses of peers ``which`` of a LocalSwarm once every one of them has finished training
    and lingers (None before): a predicate for ``wait_until``."""
    out = [swarm.status(i) for i in which]
    return out if all(s and s["phase"] == "lingering" for s in out) else None
