"""The fuzz suite's set-up: its hypothesis profile, the shared worker process, the tallies.

Every fuzz test draws ``VKML_FUZZ_EXAMPLES`` examples (a small default, so the
whole suite stays within a few minutes on two cores; set it higher to fuzz
longer by hand), derandomized so that CI tries the same inputs every run.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

from . import tally
from .runner import Worker

EXAMPLES = int(os.environ.get("VKML_FUZZ_EXAMPLES", "60"))

settings.register_profile(
    "vkml-fuzz", max_examples=EXAMPLES, deadline=None, derandomize=True, print_blob=True,
    database=None, suppress_health_check=list(HealthCheck))

#: the decorator every fuzz test wears (the profile above, without loading it for other tests)
FUZZ = settings(settings.get_profile("vkml-fuzz"))
#: random programs are the cheapest cases and the widest search: three times as many
FUZZ_PROGRAMS = settings(FUZZ, max_examples=3 * EXAMPLES)
#: a state scenario per refused call: a third as many per call (there are a dozen calls)
FUZZ_PER_CALL = settings(FUZZ, max_examples=max(5, EXAMPLES // 3))


@pytest.fixture(scope="session")
def worker():
    """One worker process for the whole session (restarted by itself after a crash or hang)."""
    w = Worker()
    yield w
    w.close()


def pytest_terminal_summary(terminalreporter):
    for line in tally.lines():
        terminalreporter.write_line(line)
    tally.write()
