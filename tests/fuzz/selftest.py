"""Worker functions that misbehave on purpose, to show the runner reports them (test_fuzz_runner)."""

import os
import signal
import time


def echo(args):
    return args


def die(args):
    os.kill(os.getpid(), getattr(signal, args["signal"]))


def sleep(args):
    time.sleep(args["seconds"])
    return "woke"


def allocate(args):
    """Touch ``args["gib"]`` GiB: beyond the worker's address-space limit, this fails cleanly."""
    try:
        bytearray(args["gib"] << 30)
    except MemoryError:
        return "refused"
    return "allocated"
