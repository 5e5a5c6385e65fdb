"""The waiting thread's timer slack (:func:`prbmrm.distributed.watch.fine_timer_slack`), read back with prctl."""

import ctypes
import sys
import threading

import pytest

from prbmrm.distributed.watch import TIMER_SLACK_NS, fine_timer_slack

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30
LINUX_DEFAULT_NS = 50_000


def _slack():
    return ctypes.CDLL(None).prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)


def test_fine_timer_slack_sets_the_calling_thread_only():
    found, mine = {}, _slack()

    def waiter():
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(LINUX_DEFAULT_NS), 0, 0, 0)
        found["before"] = _slack()
        found["set"] = fine_timer_slack()
        found["after"] = _slack()

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join()
    assert found["before"] == LINUX_DEFAULT_NS
    assert found["set"] is True
    assert found["after"] == TIMER_SLACK_NS
    assert _slack() == mine  # the other threads keep their own
