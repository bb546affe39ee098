"""The fuzz worker's main loop (started by ``runner.Worker``; see there).

Reads one JSON request per line on stdin -- ``{"function": "module:name",
"args": ...}`` naming a function of the ``fuzz`` test package -- calls it and
writes ``{"value": ...}`` (or ``{"internal": traceback}`` when the case
function itself fails) as one line on stdout.  Everything else the process
prints goes to stderr, so it cannot corrupt the protocol.
"""

import importlib
import json
import os
import resource
import sys
import traceback
import warnings


def _limit_resources():
    """No core files, and an address-space limit: a huge allocation fails instead of swapping."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    limit = int(os.environ.get("VKML_FUZZ_MEMORY_LIMIT", "0"))
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main():
    _limit_resources()
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())     # stray prints go to stderr
    warnings.simplefilter("ignore")                       # NumPy's overflow warnings, for one
    for line in sys.stdin:
        request = json.loads(line)
        module, name = request["function"].split(":")
        try:
            fn = getattr(importlib.import_module(f"fuzz.{module}"), name)
            reply = {"value": fn(request["args"])}
        except BaseException:                             # noqa: B036 -- reported, never hidden
            reply = {"internal": traceback.format_exc()}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
