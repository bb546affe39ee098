"""The fuzz runner itself: a crash or a hang in the worker is reported, and the next case runs."""

import pytest

from .runner import Worker


@pytest.fixture
def own_worker():
    w = Worker()
    yield w
    w.close()


@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGFPE", "SIGABRT"])
def test_a_crash_is_reported_and_the_worker_restarts(own_worker, sig):
    outcome = own_worker.call("selftest:die", {"signal": sig})
    assert outcome.status == "crash" and sig in outcome.detail
    assert own_worker.call("selftest:echo", [1, "a"]).value == [1, "a"]
    assert own_worker.restarts == 1


def test_a_hang_is_reported_and_the_worker_restarts(own_worker):
    outcome = own_worker.call("selftest:sleep", {"seconds": 60}, timeout=1)
    assert outcome.status == "hang"
    assert own_worker.call("selftest:echo", {"k": 2}).value == {"k": 2}


def test_the_worker_cannot_allocate_past_its_limit(own_worker):
    assert own_worker.call("selftest:allocate", {"gib": 8}).value == "refused"
    assert own_worker.call("selftest:allocate", {"gib": 0}).value == "allocated"


def test_a_broken_case_function_fails_loudly(own_worker):
    with pytest.raises(RuntimeError, match="selftest:missing"):
        own_worker.call("selftest:missing", {})
