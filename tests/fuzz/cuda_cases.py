"""Fuzz cases on the CUDA backend, run end to end on the host emulation of the driver (in the worker).

There is no GPU here, so the real backend runs on ``cuda_emulation.fake_driver``:
the generated CUDA source is compiled for the host (g++ with an emulation
header), launched through the backend's buffers, pointer table, stream
capture, graph replay and status words, and its failures are decoded by the
backend itself.  The same source also goes through ``nvcc --ptx`` (when nvcc
is installed), so what runs here is what a GPU would be given.

A host compile costs far more than running a chain, so :func:`run_batch`
runs SEVERAL chains as one program: every chain the NumPy backend runs
without an error is realized in one submission (one source, one compile),
and once more as one jitted function called twice (its second call replays
the captured graph).  Chains NumPy refuses are run one by one (lazily and
jitted), so each refusal is matched to its own chain; if a batch fails although NumPy ran
every chain of it, its chains are run one by one to find the culprit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess

from . import chains
from .codec import encode

NVCC = shutil.which("nvcc")

#: the emulated driver, installed once for the worker's life (see ``_driver``)
_STATE = []


def _driver():
    """Install the emulated driver once in this (worker) process; the backend's compiles then go
    through ``_record`` so every generated source is also checked by nvcc."""
    if not _STATE:
        import cuda_emulation
        cm = cuda_emulation.fake_driver()
        state = cm.__enter__()
        atexit.register(cm.__exit__, None, None, None)
        import pycuda.compiler as compiler
        host_compile = compiler.compile

        def compile_and_record(source, **kwargs):
            state.sources.append(source)
            return host_compile(source, **kwargs)
        compiler.compile = compile_and_record
        state.sources = []
        _STATE.append(state)
    return _STATE[0]


def nvcc_ptx(source, workdir) -> str:
    """What ``nvcc --ptx`` said of ``source`` when it failed or warned (empty: it compiled cleanly)."""
    from vkml.backends.codegen.cuda_render import NVCC_FLAGS
    path = os.path.join(workdir, "fuzz.cu")
    with open(path, "w") as f:
        f.write(source)
    proc = subprocess.run([NVCC, "--ptx", "-arch=sm_90", *NVCC_FLAGS, "-o", path[:-3] + ".ptx", path],
                          capture_output=True, text=True)
    log = (proc.stdout + proc.stderr).strip()
    return f"nvcc exit code {proc.returncode}: {log[-2000:]}" if proc.returncode or log else ""


def _numpy_reference(case) -> dict:
    import vkml
    vkml.set_backend("numpy")
    try:
        outs, tag = chains._lazy(case)
        return {"values": [encode(o) for o in outs], "tag": tag}
    except Exception as err:     # noqa: BLE001 -- every error is a result to compare
        return chains._outcome_of_error(err)


def _trace(case):
    """The chain's (lazy, unrealized) result on the current backend, or the error tracing gave."""
    import vkml
    try:
        return chains._run_ops(case["ops"], [vkml.tensor(a) for a in chains._arrays(case)])[0], None
    except Exception as err:     # noqa: BLE001
        return None, chains._outcome_of_error(err)


def _realize_lazily(cases) -> list:
    """Every case's result on the cuda backend, realized together in one submission."""
    import vkml
    traced = [_trace(c) for c in cases]
    pending = [t for t, err in traced if err is None]
    vkml.realize(pending)
    return [err if err is not None else {"values": [encode(t.numpy())]} for t, err in traced]


def _realize_one_by_one(cases) -> list:
    out = []
    for case in cases:
        try:
            out.append(_realize_lazily([case])[0])
        except Exception as err:     # noqa: BLE001
            out.append(chains._outcome_of_error(err))
    return out


def _jit(cases, calls=2) -> list:
    """Every case's result from one jitted function of all their inputs, called ``calls`` times
    (the second call replays the captured CUDA graph): per case, the results of every call."""
    import vkml
    arrays = [chains._arrays(c) for c in cases]
    bounds = [0]
    for a in arrays:
        bounds.append(bounds[-1] + len(a))

    def all_chains(*xs):
        return tuple(chains._run_ops(c["ops"], list(xs[bounds[i]:bounds[i + 1]]))[0]
                     for i, c in enumerate(cases))
    f = vkml.jit(all_chains)
    flat = [x for a in arrays for x in a]
    runs = [f(*flat) for _ in range(calls)]
    return [{"values": [encode(run[i].numpy()) for run in runs]} for i in range(len(cases))]


def _jit_one_by_one(cases) -> list:
    out = []
    for case in cases:
        try:
            out.extend(_jit([case]))
        except Exception as err:     # noqa: BLE001
            out.append(chains._outcome_of_error(err))
    return out


def run_batch(args) -> dict:
    """Run ``args["cases"]`` on NumPy and on the emulated cuda backend (see the module docstring):
    per case the results as ``chains.compare`` reads them (labels "cuda" and "cuda-jit"), plus
    what nvcc said of every source compiled and how many host compiles ran."""
    import vkml
    state = _driver()
    cases = args["cases"]
    refs = [_numpy_reference(c) for c in cases]
    clean = [i for i, r in enumerate(refs) if "error" not in r]
    refused = [i for i, r in enumerate(refs) if "error" in r]
    first_source = len(state.sources)
    lazy, jitted = [None] * len(cases), [None] * len(cases)
    vkml.set_backend("cuda")
    try:
        first_fallbacks = vkml.backends.current().fallbacks
        try:
            got = _realize_lazily([cases[i] for i in clean])
        except Exception:            # noqa: BLE001 -- found case by case below
            got = _realize_one_by_one([cases[i] for i in clean])
        for i, g in zip(clean, got):
            lazy[i] = g
        for i, g in zip(refused, _realize_one_by_one([cases[i] for i in refused])):
            lazy[i] = g
        for i, g in zip(refused, _jit_one_by_one([cases[i] for i in refused])):
            jitted[i] = g
        jit_cases = [i for i in clean if "error" not in lazy[i]]
        try:
            got = _jit([cases[i] for i in jit_cases]) if jit_cases else []
        except Exception:            # noqa: BLE001 -- found case by case below
            got = _jit_one_by_one([cases[i] for i in jit_cases])
        for i, g in zip(jit_cases, got):
            jitted[i] = g
        for i in clean:
            if jitted[i] is None:    # the lazy run refused it: compared through "cuda" already
                jitted[i] = lazy[i]
        fallbacks = vkml.backends.current().fallbacks - first_fallbacks
    finally:
        vkml.set_backend("numpy")
    sources = state.sources[first_source:]
    workdir = state.workdir
    nvcc = [nvcc_ptx(s, workdir) for s in sources] if NVCC else None
    results = [{"numpy": r, "cuda": a, "cuda-jit": b, "scale": chains._scale(c)}
               for c, r, a, b in zip(cases, refs, lazy, jitted)]
    return {"results": results, "compiles": len(sources), "fallbacks": fallbacks,
            "nvcc": nvcc}
