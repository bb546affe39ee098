"""A long-lived worker process that runs fuzz cases, so a crash or a hang fails one case, not the run.

Starting Python and importing vkml costs about half a second, far too much to
pay per case when a suite tries hundreds of them.  So one worker process
(``worker.py``) stays up and takes cases over a pipe, one JSON line each way.
A case names a function of a module in this package and passes it JSON
arguments; the worker calls it and sends back what it returned.

When the worker dies (a signal: SIGFPE, SIGSEGV, an abort) or does not answer
within the case's timeout, :meth:`Worker.call` returns an :class:`Outcome`
saying so, with the tail of the worker's stderr, and the next call starts a
fresh worker.  The worker runs under an address-space limit, so a generated
program that mallocs gigabytes gets NULL (and crashes, which the suite
reports) instead of pushing the machine into swap.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import vkml

#: the worker's address-space limit: generous for vkml, far below the machine's memory
MEMORY_LIMIT_BYTES = 3 << 30


@dataclass
class Outcome:
    """What became of one case: ``status`` is "ok" (``value`` holds the answer), "crash"
    (``detail`` names the signal or exit code) or "hang" (no answer within the timeout)."""

    status: str
    value: object = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _signal_name(returncode) -> str:
    if returncode is not None and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class Worker:
    """One worker process, restarted after every crash or hang (see the module docstring)."""

    def __init__(self, extra_env=None):
        self.extra_env = dict(extra_env or {})
        self.proc = None
        self.restarts = 0
        self._buffer = b""
        self._stderr = None

    # -- the process ------------------------------------------------------------------------
    def _start(self):
        tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        kit_dir = os.path.dirname(os.path.dirname(os.path.abspath(vkml.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([kit_dir, tests_dir] + [
            p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["VKML_FUZZ_MEMORY_LIMIT"] = str(MEMORY_LIMIT_BYTES)
        env.update(self.extra_env)
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        self._buffer = b""

    def close(self):
        """Stop the worker (this process started it, so it ends it by its own handle)."""
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _stderr_tail(self, limit=1500) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - limit))
        return self._stderr.read().decode(errors="replace")

    def _lost(self, status, detail) -> Outcome:
        """The worker crashed or hung: remember why, end it, and let the next call start anew."""
        tail = self._stderr_tail()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self.restarts += 1
        return Outcome(status, detail=f"{detail}\n--- worker stderr (tail) ---\n{tail}")

    # -- one case ---------------------------------------------------------------------------
    def call(self, function: str, args, timeout: float = 60.0) -> Outcome:
        """Run ``function`` ("module:name" in this package) with JSON ``args`` in the worker."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        line = (json.dumps({"function": function, "args": args}) + "\n").encode()
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.proc.wait()
            return self._lost("crash", f"the worker died ({_signal_name(self.proc.returncode)})")
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return self._lost("hang", f"no answer within {timeout:.0f} s")
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    self.proc.wait()
                    return self._lost("crash", f"the worker died ({_signal_name(self.proc.returncode)})")
                self._buffer += chunk
        answer, self._buffer = self._buffer.split(b"\n", 1)
        reply = json.loads(answer)
        if "internal" in reply:      # the case function itself is broken: a bug of the suite
            raise RuntimeError(f"fuzz worker: {function} failed:\n{reply['internal']}")
        return Outcome("ok", value=reply["value"])
