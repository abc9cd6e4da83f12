"""Deadlines and bounded waits: every loop of the peers ends in time, and
nothing sleeps to synchronise."""

import threading
import time


class Deadline:
    def __init__(self, seconds):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def remaining(self):
        return max(0.0, self.end - time.monotonic())

    def expired(self):
        return time.monotonic() >= self.end


def wait_until(pred, timeout, what, step=None, describe=None):
    """Waits until pred() is true, for at most `timeout` seconds.

    `step(t)` makes progress for at most t seconds (pumps a client, or waits
    on a condition); the default waits on nothing for t. On timeout raises
    AssertionError naming `what` and, if given, describe()'s text."""
    d = Deadline(timeout)
    while True:
        if pred():
            return
        if d.expired():
            text = f"timed out after {timeout}s waiting for {what}"
            if describe is not None:
                text += "\n" + describe()
            raise AssertionError(text)
        t = min(0.05, d.remaining())
        if step is not None:
            step(t)
        else:
            threading.Event().wait(t)
