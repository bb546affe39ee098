"""vkml's fuzz suite: bad and extreme inputs on every public entry, on the NumPy backend and the
compiled cpu tier, each risky call in a worker process so a crash or hang fails one case.

- ``test_fuzz_programs``: random op chains (every dtype, 0-d/empty/broadcast shapes, NaN/inf,
  reversed/transposed/strided inputs) and their gradients, NumPy backend vs cpu tier.
- ``test_fuzz_edges``: every op on the cross product of each dtype's edge values.
- ``test_fuzz_entries``: every public callable with a battery of bad arguments: only
  ``vkml.VkmlError`` may come out.
- ``test_fuzz_state``: refused calls leave tensors, ``.grad``, jit caches, planes, Param cells
  and Records as they were.
- ``test_fuzz_huge``: sizes far beyond memory are refused, never allocated.
- ``test_fuzz_graphs``: graphs over random (and non-contiguous) planes, launched and reversed.
- ``test_fuzz_runner``: the worker reports crashes, hangs and the memory limit.
- ``test_fuzz_cuda``: the random chains and edge tables on the cuda backend, run on the host
  emulation of the driver (several chains per generated source), each source also through
  ``nvcc --ptx``: NumPy backend vs cuda.

``VKML_FUZZ_EXAMPLES=600 pytest tests/fuzz`` searches longer (default 60 per test).  The run
ends with one line per area (inputs tried, seconds), also written to ``tests/fuzz/.out/``.
Failures found in today's code are strict xfails (each with its reason) and, for the random
search, recognised in ``known.py``; when a fix lands, its xfail starts failing: remove the mark
(and the ``known.py``/``known_leaks.py`` entry).
"""
