"""The compiled CPU tier: Programs as C, compiled by the system C compiler, loaded with ctypes.

Why: on the NumPy backend every equation is a NumPy call (about 0.3 us of
dispatch even on a 4-element array) and a scan is a Python loop (microseconds
per row).  Here a whole program -- fused elementwise chains, reductions,
scans and loops -- is one C function, so a scan of 10^5 rows is one call.

Libraries are cached on disk by a hash of their source and compiler flags,
in a folder of mode 0700 that must belong to the user (else a private
temporary one is used, with a warning).  A library is written to a temporary
file and renamed (safe for concurrent processes), with a hash of its name and
content beside it; it is read once through a file opened without following
symlinks, checked, and loaded from a private copy of the bytes that were
checked.  Anything that does not check out is rebuilt, never loaded
(``disk_cache`` has the rules).  Without a C compiler the tier falls back to the
NumPy backend and says so once.

Floating-point contract: compiled with ``-O2 -ffp-contract=off`` (and
vectorised) and without ``-ffast-math``: +, -, *, / and sqrt are correctly rounded IEEE operations
done in the same order as on the NumPy backend, so they give the same bits.
Every float sum (``sum``, ``mean``, and whatever is built on them, their
gradients included) adds in the one canonical tree order on both
(``vkml.ops.treesum``: a binary-counter stack per output here), so it has
the same bits too; so does ``cumsum`` (in index order everywhere) and a
deterministic matmul (the tree over k).  A program made of these may
therefore start on NumPy and switch to C when hot (``Tiered``) without
changing a bit.  Two things differ: a default ``matmul`` adds over k in
index order in C (at every size: a big float product is one call of a
blocked, vectorised GEMM that adds in that very order, ``codegen.products``;
each step one fused multiply-add unless ``VKML_FMA=0``, ``fused_products``;
the GEMM is a library of its own built once, ``gemm_library``, that a
program's products call through pointers)
but in BLAS's order on NumPy, and exp/log/sin/cos/tanh/pow
(and the other libm functions, ``codegen/libm.py``) come from libm in C, within a few
ulps of NumPy's own SIMD versions (tests use rtol 1e-12 in float64, 1e-5 in
float32).  So a program holding either is compiled at once, never switched:
every program gives the same bits on every call.  (The index order does not
depend on the machine's vector width or the GEMM's blocking either: a
product's bits on this tier are the same on every x86-64 or ARM machine.)
A simulation's per-sample loops (``SampleLoops``) go further where glibc's
vector math library is there (``vector_math``): a group of ``VK_LANES``
samples is stepped in SIMD registers and sin/cos/exp/... are libmvec's vector
versions, also within a few ulps of libm's and NumPy's.  Every sample always
goes through the same vector calls (padding lanes past the last sample,
stopped samples computed and discarded), and the reverse recomputes a window
with the same code as the forward, so a sample's bits still never depend on
the number of samples, the threads or the memory budget's passes; + - * /
and sqrt keep NumPy's bits there too.  (A ``"full"`` or ``"binomial"``
schedule is stepped by compiled per-step programs, a graph's programs: they
call the very vector functions of the window schedule's loops and give its
bits, unless the compiler left a call scalar: then they run on scalar libm,
within a few ulps of it.)
Every program compiled here -- a graph's (a kernel batched over the samples,
a whole fused launch or reverse), a jitted one, a lazy tensor's -- calls the
same vector versions in its elementwise loops: each loop runs in blocks of
8 elements through one block function compiled the same way whatever the
number of samples, the last block moved back over the end and a short loop
padded (``codegen.vector_nests``), so a sample's bits do not depend on the
number of samples, a thread's chunk or a reverse's chunk either, and an
element's bits do not depend on the array's size (a training step's GELU,
softmax and normalisation run about six times faster than through scalar
libm).  Every other call (a scan's step, a branch, a reduction's loop) goes
through a lane function running the blocks' loop on its operand: one
operand, one value, wherever the lowering put the call -- so a function's
first call (run as separate programs) has the bits of its later calls (one
fused program).  A result computed in a vector block is never computed over
its argument (the moved-back block would read values already updated).
The library of a vector build is checked after compiling (its imported
symbols: every libm call of one vector version, none scalar) and built again
with scalar libm otherwise; ``VKML_VECTOR_MATH=0`` asks for scalar libm
everywhere, and ``vkml.backend_info()`` says which is in use.

Generated code cannot corrupt the process: value sizes are checked before
anything is compiled (``base.check_sizes``), every temporary's allocation is
checked (a refusal is an ExecutionError naming the equation and the bytes),
no buffer whose size the user chooses lives on the stack, every gather and
scatter index is checked, and integer division is defined for every input
(NumPy's answers: ``MIN // -1`` wraps, ``x // 0`` is 0).  Where NumPy refuses
(a negative integer power, argmax over an empty axis) this tier refuses too,
with the same error class.

Buffers: an executable owns its outputs and temporaries across calls.  It
keeps the arrays it returned in its last two calls and writes into one again
only once nothing else references it (``sys.getrefcount``: the caller dropped
the result, or an optimiser moved on to the next step's values); an array
anyone still holds is never written.  Heap temporaries come from one scratch
block it keeps.  So a steady-state call allocates nothing and touches no fresh
page (glibc hands large freed blocks back to the system, and every fresh page
faults).  A caller may also hand it destinations that are its own arguments
(an optimiser's parameters and moments, updated where they are) for the
results the lowered statements allow (``lower.overwritable``: every read of
the argument comes before the result's stores, or at the very element a
store writes).  A call passes the C function one prepared block of array objects,
whose data pointers the C code reads itself (``DATA_OFFSET``); a program of at
most ``QUICK_WORK`` element operations keeps the GIL through the call (a tiny
call would spend a tenth of its time handing it over and taking it back),
longer ones let other threads run meanwhile.  A traced
training step -- forward, gradient and update, its calls spliced into one
program (``_calls_inlined``) -- is therefore one C function: its products are
GEMM calls that read transposed operands in place, and its updates are
vectorised loop nests writing the parameters and moments where they are.

Code is built for this CPU (``-march=native`` on x86-64, keyed by the CPU's
signature) and sibling elementwise results of one shape share one loop nest,
so an Adam update is one vectorised pass per parameter.

Ctrl-C stops a long call within a step (``interrupts``): a program holding a
while loop or scans of more than ``SHORT_WORK`` element operations, and a
simulation's per-sample loops, are called with
vkml's SIGINT handler armed (on the main thread, while Python's default
handler is in place); it sets a flag that the generated C polls every few
scan rows or while iterations and before every step of every sample (every
OpenMP thread polls), and hands the signal on to Python's handler.  The C
function then frees its temporaries and returns
:data:`~.codegen.c_render.INTERRUPTED`; nothing it computed is committed --
such a program computes into arrays of its own, never straight into the
caller's -- and the caller gets the KeyboardInterrupt, everything as before
the call.  Loop-free programs and short scans are never armed.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from sys import getrefcount

import numpy as np

from ..errors import ArgumentError, BackendError, ExecutionError
from ..ir import Program, Var, program_from_dag
from ..ops.checks import warn_at_user
from ..ops.core import rebind
from ..progress import progress_enabled
from ..stats import STATS
from . import background, disk_cache
from .base import Backend, ExecutionFailure, check_sizes, failure_error, product_threads, register
from .codegen.blocked_products import blocked_products
from .codegen.libm import INEXACT_PRIMITIVES
from .codegen.digit_loops import split_digit_loops
from .codegen.c_render import (ALLOCATION_FAILED, INTERRUPTED, POLL, SIMD_LOOP, prelude, render,
                               units_of)
from .codegen.gemm import library_source
from .codegen.lower import Lowering, Unsupported, may_fail, overwritable
from .codegen.products import gathered_operands, transposed_products
from .codegen.sample_loops import LoopSpec, forward_source, reverse_source
from .codegen.threaded_nests import THREADED_MARKER
from .codegen.vector_nests import SIMD_MARKER, VECTOR_MATH, calls_any
from .interrupts import NEVER, Armed, interrupted
from .numpy_backend import compile_program as compile_numpy


def native_flags() -> list:
    """``-march=native`` on x86-64 (unless ``VKML_CPU_NATIVE=0``): the vectoriser then uses the
    machine's widest registers (AVX-512 or AVX2 rather than SSE2), which halved an Adam update's
    time, sqrt and division being its bound.  The bits do not change: a vector sqrt, division,
    product or sum is the same correctly rounded operation in any width, ``-ffp-contract=off``
    still forbids fused multiply-adds, and no float sum is reordered.  A library built so runs
    only on CPUs like this one: its cache key holds the CPU's signature (``cpu_signature``)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or \
            os.environ.get("VKML_CPU_NATIVE", "1") == "0":
        return []
    return ["-march=native"]


@functools.lru_cache(maxsize=None)
def cpu_signature() -> str:
    """What this CPU can run (its model and instruction-set flags from ``/proc/cpuinfo``; the
    platform's processor name elsewhere): part of a native library's cache key, so a cache
    shared with another machine never hands it code its CPU cannot run."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


# -fwrapv: signed integer overflow wraps, as NumPy's integers do (without it -x of INT_MIN is
# undefined behaviour, and the optimiser folds ``-x < 0`` to true).
# -ftree-vectorize with the dynamic cost model: elementwise loops run in SIMD registers (with
# run-time checks where pointers may overlap), 3x faster on an Adam update; without -ffast-math
# the vectoriser never reorders a float sum or contracts a multiply-add, and +, -, *, / and sqrt
# are the same correctly rounded operations in SIMD, so every result keeps its bits.
FLAGS = ["-O2", "-pipe", "-fPIC", "-shared", "-std=c99", "-ffp-contract=off", "-fno-fast-math",
         "-fno-strict-aliasing", "-fno-math-errno", "-fwrapv", "-ftree-vectorize"] + native_flags()
#: flags only GCC takes (clang refuses them): the dynamic cost model above, and
#: vect-max-version-for-alias-checks: a loop nest storing several results
#: (an Adam update: moments and parameter in one pass) needs more run-time overlap checks than
#: GCC's default 10 allows; past them it stays scalar (5.7x slower on that update).
GCC_FLAGS = ["-fvect-cost-model=dynamic", "--param=vect-max-version-for-alias-checks=64"]


#: generated C with a function longer than this compiles at -O1 (with the vectoriser still on):
#: GCC's -O2 passes grow faster than linearly with a function's size -- a 370 KB program (a
#: special function's series and its derivatives, unrolled) took 158 s at -O2 and 5.6 s at -O1
#: -ftree-vectorize.  A long body cut into part functions (``c_render.split_body``) stays at
#: -O2: its parts are small, and -O2 runs them faster (a transformer step on two cores 16.3 ->
#: 13.7 ms, its first call 0.76 -> 0.96 s).  The bits are the same at either level (no
#: fast-math, no contraction).
LARGE_SOURCE = 64 * 1024

#: a line starting a function's definition in generated C (its head ends the line with ``{``)
_FUNCTION_HEAD = re.compile(r"^[A-Za-z_][^\n;]*\)\s*\{[ \t]*$", re.M)


def longest_function(source: str) -> int:
    """Characters of the longest stretch of ``source`` from one function's head to the next (or
    to the end): an upper bound of its longest function's C, which is what -O2's time grows
    with."""
    starts = [0] + [m.start() for m in _FUNCTION_HEAD.finditer(source)] + [len(source)]
    return max(b - a for a, b in zip(starts, starts[1:]))


@functools.lru_cache(maxsize=None)
def is_gcc(cc) -> bool:
    """Whether the C compiler ``cc`` is GCC (its ``--version`` names the Free Software
    Foundation; clang's does not)."""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in out


def compiler():
    """The C compiler: ``$CC``, else cc/gcc/clang on PATH, else None."""
    for name in [os.environ.get("CC"), "cc", "gcc", "clang"]:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cache_dir() -> str:
    """The per-user library cache (``$VKML_CACHE_DIR/cpu`` or ``~/.cache/vkml/cpu``), mode 0700."""
    return disk_cache.cache_dir("cpu")


def library(source: str, extra_flags=(), inspect=None, generated=True, quick=False):
    """The compiled library for ``source``: from the disk cache if a trusted one is there, else built.

    Returns ``(ctypes.CDLL, compiled)`` where ``compiled`` says whether the compiler ran.  What
    is trusted, and how a library is loaded from the very bytes that were checked, is in
    ``disk_cache``; ``inspect``, if given, is called with those bytes before they are loaded.
    A ``generated`` source with a function longer than ``LARGE_SOURCE`` compiles at -O1 (the
    GEMM library, written by hand and built once, always at -O2), and so does a ``quick`` one
    (the first build of a big program: see ``SECOND_BUILD_SOURCE``)."""
    cc, flags, key = _build_key(source, extra_flags, generated, quick)

    def load(data, folder):
        if inspect is not None:
            inspect(data)
        return _load(data, folder)
    return disk_cache.cached("cpu", key, ".so", lambda folder: _compile_c(cc, flags, source, folder),
                             load)


def _build_key(source, extra_flags, generated, quick=False):
    """``(compiler, flags, cache key)`` of ``library(source, ...)``'s build."""
    cc = compiler()
    if cc is None:
        raise BackendError("no C compiler found (set $CC or install gcc)")
    flags = FLAGS + (GCC_FLAGS if is_gcc(cc) else []) + list(extra_flags)
    if generated and (quick or len(source) > LARGE_SOURCE and
                      longest_function(source) > LARGE_SOURCE):
        flags = ["-O1" if f == "-O2" else f for f in flags]
    signature = [cpu_signature()] if "-march=native" in flags else []
    key = hashlib.sha256("\0".join([source, cc] + flags + signature).encode()).hexdigest()[:32]
    return cc, flags, key


#: generated C longer than this is built twice when no build of it is in the disk cache: at -O1
#: first, which the first call runs (a transformer step's 118 KB: its first call 1.1 -> 0.8 s),
#: then at -O2 on a background thread, which the program switches to when it is ready (about a
#: second later; the same bits, see ``CpuBackend._compile_c``) and which the cache keeps.
#: ``VKML_SECOND_BUILD=0``: build once, at -O2, before the first call.
SECOND_BUILD_SOURCE = 64 * 1024
#: seconds the second build waits for the program's first call to return before it starts
SECOND_BUILD_WAIT = 5.0


def second_builds() -> bool:
    """Whether big programs get a quick build first (``VKML_SECOND_BUILD``: 1, the default, or 0)."""
    text = os.environ.get("VKML_SECOND_BUILD", "1")
    if text not in ("0", "1"):
        raise ArgumentError(f"VKML_SECOND_BUILD must be 1 (a big program's first build quick, "
                            f"its optimised one in the background, the default) or 0 (one "
                            f"optimised build before the first call), got {text!r}")
    return text == "1"


def _big_programs() -> str:
    """How big programs are built (``backend_info``)."""
    try:
        quick = second_builds()
    except ArgumentError as e:
        return str(e)
    return (f"over {SECOND_BUILD_SOURCE // 1024} KB of C: built with -O1 for the first call, then "
            "with -O2 in the background (VKML_SECOND_BUILD=0: once, with -O2)" if quick else
            "built once, with -O2 (VKML_SECOND_BUILD=0)")


def wants_second_build(source, extra_flags) -> bool:
    """Whether ``source``'s first build is a quick -O1 one, its -O2 build following in the
    background: a big generated source (``SECOND_BUILD_SOURCE``) that compiles at -O2, not in
    the disk cache yet, with ``VKML_SECOND_BUILD`` not ``0``."""
    if len(source) <= SECOND_BUILD_SOURCE or not second_builds():
        return False
    _, flags, key = _build_key(source, extra_flags, True)
    if "-O2" not in flags:
        return False
    try:
        return disk_cache.read_entry(cache_dir(), f"vk_{key}.so", key) is None
    except OSError:                 # no cache folder: ``library`` says why, and builds once
        return False


def _import_reader(math, vector, into):
    """What a build's ``inspect`` is: where the program calls libm in vector versions, a reader
    of the ``math`` functions' versions the built bytes import (into the dict ``into``)."""
    return (lambda data: into.update(math_imports(data, math))) if vector else None


def _build_later(compiled, source, flags, math, vector, imports):
    """Build ``source`` at -O2 on a background thread once ``compiled`` (its -O1 build) has
    run a first call, and switch ``compiled`` to it if it imports libm's vector versions
    ``imports`` exactly as the -O1 build does (the same bits: both come from one source with
    no fast-math and no contraction)."""
    compiled.optimised.clear()

    def optimise():
        compiled.first_call_done(SECOND_BUILD_WAIT)
        found = {}
        try:
            better = _built(source, flags, _import_reader(math, vector, found))
        except Exception:           # a failed rebuild leaves the -O1 build running
            better = None
        if better is not None and found == imports:
            compiled.take(better)
        compiled.optimised.set()
    if background.later(optimise) is None:
        compiled.optimised.set()


def vector_math() -> frozenset:
    """The libm functions a simulation's compiled loops and a graph's programs may call in glibc's
    vector versions (libmvec), several samples at once in SIMD registers: those of
    ``vector_nests.VECTOR_MATH`` that libmvec has for every x86-64 register width.  Empty (the
    scalar libm calls, as elsewhere) without libmvec, off x86-64, or with
    ``VKML_VECTOR_MATH=0``.  A vector sin is within a few ulps of libm's, as libm's is of NumPy's:
    only the cpu tier's transcendentals change, never +, -, *, / or sqrt."""
    if os.environ.get("VKML_VECTOR_MATH", "1") == "0":
        return frozenset()
    return _libmvec_functions()


@functools.lru_cache(maxsize=None)
def _libmvec_functions() -> frozenset:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return frozenset()
    try:
        libmvec = ctypes.CDLL("libmvec.so.1")
    except OSError:
        return frozenset()
    found = set()
    for name, (ctype, arity) in VECTOR_MATH.items():
        lanes = 2 if ctype == "double" else 4          # in a 128-bit register
        variants = [f"_ZGV{isa}N{lanes * wide}{'v' * arity}_{name}"
                    for isa, wide in (("b", 1), ("c", 2), ("d", 2), ("e", 4))]
        if all(hasattr(libmvec, v) for v in variants):
            found.add(name)
    return frozenset(found)


def math_imports(data: bytes, names) -> dict:
    """For each function of ``names``, the versions the shared library ``data`` imports: its
    scalar name and any vector ones (``_ZGV..._name``), read off the library's symbol names --
    its table of undefined dynamic symbols where ``data`` is an ELF library (a plain search of
    the names would miss a scalar ``cos``: the linker stores it as the tail of the string
    ``_ZGVeN8v_cos``), else the names as they appear in the bytes."""
    imported = elf_imports(data)
    if imported is not None:
        found = {}
        for symbol in imported:
            vector = _VECTOR_SYMBOL.fullmatch(symbol)
            name = vector.group(1) if vector else symbol
            if name in names:
                found.setdefault(name, set()).add(symbol)
        return found
    found = {}
    for name in names:
        raw = name.encode()
        versions = set(re.findall(rb"(?<=\0)_ZGV[a-zA-Z]N\d+v+_" + raw + rb"(?=\0)", data))
        if b"\0" + raw + b"\0" in data:
            versions.add(raw)
        if versions:
            found[name] = {v.decode() for v in versions}
    return found


#: a vector version's symbol (the x86-64 vector function ABI's name): ``_ZGVeN8v_sin``
_VECTOR_SYMBOL = re.compile(r"_ZGV[a-zA-Z]N\d+v+_(\w+)")


def elf_imports(data: bytes):
    """The names of the undefined symbols of the dynamic symbol table of ``data``, a 64-bit
    little-endian ELF shared library (what it imports); None for anything else."""
    if data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01" or len(data) < 64:
        return None
    try:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                    for i in range(shnum)]
        names = set()
        for _, kind, _, _, offset, size, link, _, _, entsize in sections:
            if kind != 11 or not entsize:            # SHT_DYNSYM
                continue
            strings = sections[link][4]
            for at in range(offset, offset + size, entsize):
                st_name, _, _, st_shndx = struct.unpack_from("<IBBH", data, at)
                if st_shndx == 0 and st_name:          # undefined: imported
                    start = strings + st_name
                    names.add(data[start:data.index(b"\0", start)].decode())
        return names
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        return None


def all_vector(imports) -> bool:
    """Whether a library's libm imports (``math_imports``) are all vector versions, one per
    function: then every call of a function gives its result through the very same code (no
    loop the compiler left scalar, no tail of a loop run through the scalar function)."""
    return all(len(versions) == 1 and name not in versions for name, versions in imports.items())


def _built(source, extra_flags, inspect=None, generated=True, quick=False):
    """``library(source, ...)``'s library, or None (after one warning) when no folder could hold
    the build (disk full, read-only, gone): the program then runs on NumPy."""
    try:
        return library(source, extra_flags, inspect, generated, quick)[0]
    except BackendError as e:
        if disk_cache.folder_fault(e) is None:
            raise
        disk_cache.warn_once(str(e), f"{e}; vkml runs these programs on NumPy instead")
        return None


def _load(data: bytes, folder) -> ctypes.CDLL:
    """The library ``data`` (checked bytes), loaded from a private copy in ``folder``."""
    try:
        return disk_cache.load_private_copy(data, folder, ctypes.CDLL)
    except OSError as e:
        raise BackendError(f"a freshly compiled library could not be loaded from {folder} ({e}); if "
                           "that folder is on a filesystem mounted noexec, set VKML_CACHE_DIR to "
                           "another one") from e


#: seconds a compile runs before a note says what is being compiled (where progress is shown)
COMPILE_NOTE_AFTER = 1.0


def _run_compiler(commands, size) -> subprocess.CompletedProcess:
    """``commands`` (compiler runs, side by side) run to the end: the first that fails, else the
    last.  A compile that takes longer than ``COMPILE_NOTE_AFTER`` seconds is announced on stderr
    where progress is shown (in a notebook, or ``VKML_PROGRESS=1``), with its time when it ends:
    the first call of a big program is not a silent wait."""
    procs = []
    try:
        for command in commands:
            procs.append(subprocess.Popen(command, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
            if not background.started(procs[-1]):      # the process is ending
                break
        start, note, results = time.perf_counter(), None, []
        for proc in procs:
            while True:
                try:
                    left = max(0.0, start + COMPILE_NOTE_AFTER - time.perf_counter())
                    out, err = proc.communicate(timeout=None if note is not None else left)
                    break
                except subprocess.TimeoutExpired:
                    note = progress_enabled() and not background.active()
                    if note:
                        sys.stderr.write(f"vkml: compiling a new program ({size // 1024} KB of "
                                         "C) ...\n")
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        if note:
            sys.stderr.write(f"vkml: compiled in {time.perf_counter() - start:.1f} s "
                             "(kept in the disk cache: next time it loads at once)\n")
    except BaseException:          # Ctrl-C while compiling: the compilers stop too
        for proc in procs:
            proc.kill()
            proc.wait()
        raise
    finally:
        for proc in procs:
            background.finished(proc)
    return next((r for r in results if r.returncode != 0), results[-1])


def _compile_c(cc, flags, source, folder) -> bytes:
    """The shared library the C compiler makes of ``source`` in a scratch folder inside ``folder``,
    as bytes (counted as a compile).  A source of several units (``c_render.units_of``: a long
    program's part functions) has each compiled by its own compiler, side by side, then linked."""
    with tempfile.TemporaryDirectory(prefix=".build-", dir=folder) as work:
        out = os.path.join(work, "vk.so")
        units = units_of(source)
        sources = [os.path.join(work, f"vk{k}.c") for k in range(len(units))]
        for path, text in zip(sources, units):
            with open(path, "w") as f:
                f.write(text)
        if len(units) == 1:
            commands = [[cc] + flags + ["-o", out, sources[0], "-lm"]]
        else:
            objects = [path[:-2] + ".o" for path in sources]
            commands = [[cc] + [f for f in flags if f != "-shared"] + ["-c", "-o", o, path]
                        for path, o in zip(sources, objects)]
        proc = _run_compiler(commands, len(source))
        if proc.returncode == 0 and len(units) > 1:
            proc = _run_compiler([[cc] + flags + ["-o", out] + objects + ["-lm"]], 0)
        if proc.returncode != 0:
            error = BackendError(f"the C compiler failed on generated code:\n{proc.stderr[-2000:]}")
            raise error from disk_cache.fault_in_message(proc.stderr, work)
        STATS.compiles += 1
        with open(out, "rb") as f:
            return f.read()


def fused_products() -> bool:
    """Whether default-order float products add each term with one fused multiply-add
    (``VKML_FMA``, read when a program is compiled; on unless it is ``0``).

    Both modes add each output's terms for k = 0, 1, ... in turn, whatever the size, blocking,
    vector width or number of threads; they differ in the step.  Fused (the default): ``acc =
    fma(a, b, acc)``, one exactly rounded operation -- twice the arithmetic per cycle where the
    CPU has FMA units (on a Sapphire Rapids core the GEMM goes from 46 % of the machine's peak to
    about 70 %), and the same bits on every machine, since C's ``fma`` is exactly rounded in
    hardware or in libm's software alike.  ``VKML_FMA=0``: a rounded product, then a rounded
    sum -- the plain loops' bits (what ``acc += a * b`` gives, and a NumPy loop over k)."""
    text = os.environ.get("VKML_FMA", "1")
    if text not in ("0", "1"):
        raise ArgumentError(f"VKML_FMA must be 1 (fused multiply-adds in products, the default) "
                            f"or 0 (a rounded product then a rounded sum), got {text!r}")
    return text == "1"


def c_source(program, vector_math=(), blocks=True, split=True):
    """The C source of ``program`` and its lowering (whose ``errors``, ``error_sites`` and
    ``temp_vars`` decode what the function reports; raises Unsupported for what the lowering
    cannot compile).  ``vector_math``: the libm functions it calls in vector versions -- in
    vector blocks in its elementwise loop nests, through lane functions elsewhere
    (``codegen.vector_nests``); a program that calls none of them is plain C.  Without
    ``blocks``: through lane functions everywhere; without ``split``, the body one function
    however long (``c_render.split_body``)."""
    origin = {}
    flat = _calls_inlined(program, origin)       # (a product and its transpose may be in two calls)
    program, sites = transposed_products(flat, None if flat is program else
                                         [origin[id(e)] for e in flat.eqns])
    low, stmts, ins, outs = _lowered(program, sites, scalars_in_locals=True)
    if not calls_any(stmts, vector_math):
        vector_math = ()
    elif any(v.shape == () for v in program.inputs):
        # block functions take every buffer they read: no 0-d argument read into a local
        low, stmts, ins, outs = _lowered(program, sites, scalars_in_locals=False)
    # (vector blocks compute a nest's last elements twice: never over an argument; never
    # over a lifted constant: ``ins`` are the caller's arguments only)
    low.overwritable = overwritable(stmts, ins, outs, program, vector_math)
    low.may_fail = may_fail(stmts)
    in_types = [v.dtype for v in program.inputs] + [c.dtype for c in low.lifted]
    return render(low, stmts, len(in_types), in_types,
                  len(outs), [v.dtype for v in program.outputs], data_offset=DATA_OFFSET,
                  vector_math=vector_math, blocks=blocks, split=split,
                  threads=low.gemm_threads, units=min(2, low.gemm_threads)), low


def _lowered(program, sites, scalars_in_locals):
    """``program`` lowered for the cpu tier: ``(lowering, statements, inputs, outputs)``."""
    low = Lowering()
    low.sites = sites
    low.gemm = True
    low.gemm_threads = gemm_threads()
    low.fused = fused_products()
    low.checks = True
    low.fuse_loops = True
    low.scalars_in_locals = scalars_in_locals
    low.column_trees = True
    low.padded_sums = True
    low.row_trees = True
    low.vector_max = True
    low.inline_reductions = True
    low.lift_from = len(program.inputs)
    low.gather_operands = gathered_operands
    low.block_products = blocked_products
    low.interrupt_poll = POLL
    ins = [f"a{i}" for i in range(len(program.inputs))]
    outs = [f"o{i}" for i in range(len(program.outputs))]
    return low, split_digit_loops(low.program(program, ins, outs)), ins, outs


def _data_offset():
    """Where a NumPy array object keeps its data pointer (right after the object header, in
    NumPy's public array struct), checked on a few arrays; None if the check fails (then every
    call asks each array for its pointer through ctypes)."""
    offset = object.__basicsize__
    base = np.arange(8.0)
    for probe in (np.empty(3), base[2:], np.zeros((2, 2), np.int32)):
        if ctypes.c_void_p.from_address(id(probe) + offset).value != probe.ctypes.data:
            return None
    return offset


#: where a NumPy array object keeps its data pointer (None: not found, see _data_offset)
DATA_OFFSET = _data_offset()


def _tuple_items():
    """Where a tuple object keeps its item pointers (in a row, right after its header), checked
    on a tuple; None if the check fails (then every call takes the unpooled path)."""
    offset = tuple.__basicsize__
    probe = (np.empty(1), np.empty(2), object())
    for i, item in enumerate(probe):
        if ctypes.c_void_p.from_address(id(probe) + offset + i * tuple.__itemsize__).value != id(item):
            return None
    return offset


#: where a tuple keeps its items (None: not found, see _tuple_items)
TUPLE_ITEMS = _tuple_items()


def allocation_error(what, shape, dtype):
    """The error for an allocation that failed: NumPy's MemoryError, as the NumPy backend's
    executables report it (wrapped in ExecutionFailure, an ExecutionError)."""
    nbytes = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
    return MemoryError(f"could not allocate {nbytes} bytes for {what} of shape {list(shape)} "
                       f"({np.dtype(dtype).name})")


def _empty_result(shape, dtype, what, index):
    """``np.empty``, with a refused allocation reported as the failure of equation ``index``."""
    try:
        return np.empty(shape, dtype)
    except (MemoryError, ValueError):
        raise ExecutionFailure(index, allocation_error(what, shape, dtype)) from None


def _blas_matmuls(program):
    """The default-order matrix products of ``program`` and the programs nested in it."""
    for e in program.eqns:
        if e.prim.name == "matmul" and "order" not in e.params:
            yield e
        for p in e.params.values():
            if hasattr(p, "eqns"):
                yield from _blas_matmuls(p)


def _calls_inlined(program, origin):
    """``program`` with the equations of every ``call`` (a jitted function's, the forward and
    the backward of a gradient) in place of the call: a product and the transpose of its
    result may then meet (``codegen.products``), fusion spans what the calls cut apart (a
    loss's last equations and its gradient's first), and no call's results are copied out.
    ``program`` itself when it holds no call.  ``origin`` receives, by ``id``, the index in
    ``program`` of each new equation's source (a call's, for the equations spliced in its
    place).  A run-time check whose result nothing reads (a loop's inside a gradient's
    forward) is kept: its warning or error still comes."""
    if not any(e.prim.name == "call" for e in program.eqns):
        return program
    inputs = [Var(v.shape, v.dtype, v.device, weak=v.weak) for v in program.inputs]
    checks = []
    outputs = _replayed(program, inputs, origin, checks)
    whole = program_from_dag(inputs, outputs + checks)
    return Program(whole.inputs, whole.eqns, outputs, whole.consts)


def _replayed(program, args, origin, checks, site=None) -> list:
    """The Vars of ``program``'s outputs, its equations bound again on Vars ``args`` (a call's
    equations replayed in its place, recursively); each new equation's source in ``origin``:
    its own index, or ``site`` (the top-level call's) inside a call.  The results of the
    run-time checks (``checked``) are appended to ``checks``."""
    env = dict(zip(program.inputs, args))
    for i, e in enumerate(program.eqns):
        operands = [env.get(v, v) for v in e.inputs]
        here = i if site is None else site
        if e.prim.name == "call":
            outs = _replayed(e.params["program"], operands, origin, checks, here)
        else:
            outs = rebind(e, operands)
            outs = outs if e.prim.multiple_results else [outs]
            if outs:
                origin[id(outs[0].eqn)] = here
            if e.prim.name == "checked":
                checks += outs
        env.update(zip(e.outputs, outs))
    return [env.get(v, v) for v in program.outputs]


def _link_products(lib, types, gemm):
    """Point ``lib``'s products of element ``types`` at the GEMM library ``gemm``'s routines."""
    for t in types:
        for name in (t, f"gathered_{t}"):
            ctypes.c_void_p.in_dll(lib, f"vk_gemm_{name}").value = \
                ctypes.cast(getattr(gemm, f"vk_gemm_lib_{name}"), ctypes.c_void_p).value


class CompiledProgram:
    """A program's C function, called with contiguous arrays.

    A program holding a while loop, or scans doing more than ``SHORT_WORK`` element operations,
    may run long, so its call is interruptible (armed, see the module docstring) and computes
    into arrays of its own, never into ``into``: a call stopped half-way then leaves the
    caller's arrays as they were (``Backend.run`` copies the results in once the call has
    succeeded).  A shorter scan runs to its end, as a loop-free program does."""

    def __init__(self, program, lib, source, lowering, gemm=None):
        #: the GEMM library its products call (held with the program that points into it)
        self.gemm = gemm
        self.fn = lib.vk_main
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.interruptible = _may_run_long(program)
        #: whether a call is too short for letting other threads run during it to pay
        self.quick = _work(program) <= QUICK_WORK
        #: the constants too large for the source, handed in after the caller's arguments
        #: (``Lowering.lift_from``)
        self.constants = tuple(lowering.lifted)
        self.in_types = [v.dtype for v in program.inputs] + [c.dtype for c in self.constants]
        self.out_types = [(v.shape, v.dtype) for v in program.outputs]
        producer = {v: i for i, e in enumerate(program.eqns) for v in e.outputs}
        self.out_sites = [producer.get(v, 0) for v in program.outputs]
        self.source = source
        self.errors, self.error_sites = lowering.errors, lowering.error_sites
        self.messages, self.warnings = lowering.messages, lowering.warnings
        self.temps = [(v.shape, v.dtype, producer.get(v, 0)) for v in lowering.temp_vars]
        #: results the C function may compute in an argument's buffer (see ``lower.overwritable``);
        #: none for an interruptible call, which never writes the caller's arrays, nor for one
        #: issuing warnings after it has written them (a filter may make them errors)
        self.overwritable = {} if self.interruptible or self.warnings else lowering.overwritable
        #: per result, the arguments it may be a view of: none (results are its own arrays)
        self.views = [frozenset()] * len(program.outputs)
        #: the results it computes straight into a destination given for them (``into``)
        self.writes_directly = frozenset() if self.interruptible else frozenset(range(len(program.outputs)))
        #: whether a call may stop with an error (a check in its code, an interrupt, a warning
        #: issued after it that the caller's filters may turn into one)
        self.may_fail = self.interruptible or lowering.may_fail or bool(self.warnings)
        self.gemm_types = tuple(lowering.gemm_types)
        _link_products(lib, self.gemm_types, gemm)
        #: the libraries its functions come from (a call may still run in one it switched from)
        self._keep = [lib]
        self._pool = self._prepare(lib, lowering)
        #: set once a second, optimised build has been switched to or given up (``take``); set
        #: from the start where there is none
        self.optimised = threading.Event()
        self.optimised.set()

    writes_into = True

    def _prepare(self, lib, lowering):
        """What the pooled call reuses (see ``call_ready``); None without ``vk_objs`` or where
        a tuple's items cannot be handed over as the block of objects (``TUPLE_ITEMS``)."""
        fn = self._objs_function(lib)
        if fn is None:
            return None
        info = np.zeros(3 + len(self.warnings), np.int64)
        return _Pool(fn, info, [None] * len(self.out_types), lowering.scratch[1])

    def _objs_function(self, lib):
        """``lib``'s ``vk_objs`` as the pooled call calls it, or None (see ``_prepare``)."""
        fn = getattr(lib, "vk_objs", None) if DATA_OFFSET is not None else None
        if fn is None or TUPLE_ITEMS is None:
            return None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        if self.quick:          # called holding the GIL: no release and take-back around it
            fn = _HOLDING_GIL(ctypes.cast(fn, ctypes.c_void_p).value)
        return fn

    def first_call_done(self, limit):
        """Return once a pooled call has run and returned (or after ``limit`` seconds): what the
        second build waits for, so its compilers do not take the cores from the first call."""
        if self._pool is not None:
            background.wait_for(self._pool.called, limit)

    def take(self, lib):
        """Switch to ``lib``: the same source built again, optimised (``CpuBackend._compile_c``).
        Each call runs in one library or the other, whole: a call running meanwhile finishes in
        the one it started in, which stays loaded."""
        _link_products(lib, self.gemm_types, self.gemm)
        fn = lib.vk_main
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        objs = self._objs_function(lib)
        self._keep.append(lib)
        self.fn = fn
        if self._pool is not None and objs is not None:
            self._pool.fn = objs

    def __call__(self, args, into=None):
        """Run once; ``into`` (see ``Backend.run``): destinations the C function writes directly.

        The arguments go to ``call_ready`` as C-contiguous arrays of the input dtypes (converted
        copies where they are not)."""
        if self._pool is None:
            return self._call_fresh(args, into)
        for a, t in zip(args, self.in_types):
            if type(a) is not np.ndarray or a.dtype is not t or not a.flags.c_contiguous:
                args = [np.ascontiguousarray(a, dtype=t) for a, t in zip(args, self.in_types)]
                break
        return self.call_ready(args, into)

    def call_ready(self, args, into=None):
        """Run once on ``args`` that are C-contiguous arrays of the input dtypes (the caller
        checked: a jitted call's plan knows it from its arguments' types, see ``programs``).

        A call that finds the executable free (not running in another thread) reuses its
        outputs and temporaries, calling ``vk_objs`` with the arguments, outputs and scratch
        block as the items of one tuple (``TUPLE_ITEMS``: a tuple keeps its item pointers in a
        row, the block of array objects ``vk_objs`` reads; cheaper than filling a ctypes array
        item by item).  A destination in ``into`` of the output's shape and dtype is written
        directly (not by an interruptible call: see the class docstring), and no array of the
        executable's own is touched for it.

        The rule for reusing outputs: the executable keeps the arrays it returned in its last two
        calls for each output and writes into one again only if nothing else references it any
        more (the caller dropped the result: ``sys.getrefcount``); an array still held by anyone
        -- a Tensor, a view of it, a list -- is left to its holder, and a new one is allocated
        (and kept) when neither is free.
        So a steady-state call whose previous results were dropped allocates nothing; the heap
        temporaries live in one scratch block the executable keeps (allocated on first use)."""
        pool = self._pool
        if pool is None:
            return self._call_fresh(args, into)
        free = pool.free
        try:
            token = free.pop()      # the pool's token (an atomic list.pop)
        except IndexError:          # held by a call running in another thread: fresh arrays
            return self._call_fresh(args, into)
        try:
            outs = pool.outs
            if into is None or self.interruptible:
                for j in pool.slots:
                    out = outs[j]       # (an index loop: enumerate's tuple would hold one more)
                    if out is None or getrefcount(out) > 3:   # the pool's, ``out``, the call's
                        self._next_buffer(pool, j)
            else:
                outs = self._pooled_or_into(pool, into)
            scratch = pool.scratch
            if scratch is None:
                scratch = pool.allocate_scratch()
                if scratch is None:       # refused: the C function mallocs them (and reports)
                    return self._call_fresh(args, into)
            block = (*args, *self.constants, *outs, scratch)
            if self.interruptible:
                with Armed() as stop:
                    code = pool.fn(id(block) + TUPLE_ITEMS, pool.info_address, stop)
                if code == INTERRUPTED:
                    interrupted()
            else:
                code = pool.fn(id(block) + TUPLE_ITEMS, pool.info_address, NEVER)
            if code or pool.warns:
                self._check(code, pool.info)
            return list(outs)
        finally:
            free.append(True)
            if token is NOT_CALLED:
                pool.called.set()

    def _pooled_or_into(self, pool, into):
        """Per output, its destination in ``into`` where one fits (``_destinations``), else the
        pool's array for it (reused or made as ``call_ready`` says)."""
        dests = self._destinations(into)
        outs = pool.outs
        for j in pool.slots:
            out = outs[j]
            if dests[j] is None and (out is None or getrefcount(out) > 3):   # as in call_ready
                self._next_buffer(pool, j)
        return [outs[j] if dests[j] is None else dests[j] for j in pool.slots]

    def _destinations(self, into):
        """Per output, the destination of ``into`` it is written into directly, or None (one of
        another shape or dtype is filled by ``Backend.run`` with a copy)."""
        types = self.out_types
        return [into[j] if into[j] is not None and into[j].shape == types[j][0] and
                into[j].dtype == types[j][1] else None for j in range(len(types))]

    def _next_buffer(self, pool, j):
        """Output ``j``'s last array is still held: write into its spare (the one returned the
        call before, if its holder let go of it since -- an optimiser's parameters hold one
        step's values while the next is computed) or into a new array (then the held one becomes
        the spare)."""
        outs, spares = pool.outs, pool.spares
        spare = spares[j]
        if spare is not None and getrefcount(spare) <= 3:    # the pool's, ``spare``, the call's
            outs[j], spares[j] = spare, outs[j]
            return
        shape, dtype = self.out_types[j]
        spares[j] = outs[j]
        outs[j] = _empty_result(shape, dtype, "a result", self.out_sites[j])
        pool.allocations += 1

    def _call_fresh(self, args, into):
        """One call with fresh outputs and the temporaries malloc'ed by the C function."""
        ins = [np.ascontiguousarray(a, dtype=t) for a, t in zip([*args, *self.constants], self.in_types)]
        dests = self._destinations(into) if into is not None and not self.interruptible else \
            [None] * len(self.out_types)
        outs = [_empty_result(shape, dtype, "a result", site) if dest is None else dest
                for (shape, dtype), site, dest in zip(self.out_types, self.out_sites, dests)]
        in_ptrs = (ctypes.c_void_p * max(1, len(ins)))(*[a.ctypes.data for a in ins])
        out_ptrs = (ctypes.c_void_p * max(1, len(outs)))(*[o.ctypes.data for o in outs])
        info = np.zeros(3 + len(self.warnings), np.int64)
        if self.interruptible:
            with Armed() as stop:
                code = self.fn(in_ptrs, out_ptrs, info.ctypes.data, stop)
            if code == INTERRUPTED:
                interrupted()
        else:
            code = self.fn(in_ptrs, out_ptrs, info.ctypes.data, NEVER)
        self._check(code, info)
        return outs

    def _check(self, code, info):
        """Issue the warnings that fired and raise the error the C function reported."""
        for message, hit in zip(self.warnings, info[3:]):
            if hit:                         # a warning check that fired: once per call
                warn_at_user(message)
        if code == ALLOCATION_FAILED:
            shape, dtype, site = self.temps[int(info[0])]
            raise ExecutionFailure(site, allocation_error("a temporary", shape, dtype))
        if code:
            message = self.messages.get(code)
            raise ExecutionFailure(self.error_sites[code - 1],
                                   ExecutionError(message) if message is not None else
                                   failure_error(self.errors[code - 1], info))


#: the scratch block of a program with no temporaries on the heap (never read)
_NO_SCRATCH = np.empty(1, np.uint8)


#: a pool's token before its first call
NOT_CALLED = object()


class _Pool:
    """What one executable's pooled calls reuse (one call at a time: the one that took the
    token from ``free``, a one-item list -- ``list.pop`` and ``append`` are atomic, and cost a
    third of a lock's acquire and release): the info words, the arrays it returned in the last
    two calls (``outs`` and ``spares``; see ``CompiledProgram.call_ready`` for when they are
    written again) and the scratch block of the heap temporaries."""

    def __init__(self, fn, info, outs, scratch_bytes):
        self.fn, self.info, self.outs = fn, info, outs
        self.slots = range(len(outs))
        self.warns = len(info) > 3        # the program has warning checks: look at their words
        self.spares = [None] * len(outs)
        self.info_address = info.ctypes.data
        self.scratch_bytes = scratch_bytes
        self.scratch = None if scratch_bytes else _NO_SCRATCH
        #: the token: ``NOT_CALLED`` until the first call returns it as ``True`` and sets
        #: ``called``
        self.free = [NOT_CALLED]
        self.called = threading.Event()
        #: arrays this pool allocated (outputs and the scratch block): what tests count
        self.allocations = 0

    def allocate_scratch(self):
        """The temporaries' block, allocated on first use; None if it is refused."""
        try:
            self.scratch = np.empty(self.scratch_bytes, np.uint8)
        except (MemoryError, ValueError):
            return None
        self.allocations += 1
        return self.scratch


def hot_threshold() -> int:
    """Runs a loop-free program makes on NumPy before it is compiled (``VKML_CPU_HOT``, default 1).

    Compiling costs tens of milliseconds; a program that runs once (an eager
    op, a one-off realize) is cheaper on NumPy.  Programs holding a loop
    (scan, while) are compiled at once: that is where C wins most."""
    try:
        return max(0, int(os.environ.get("VKML_CPU_HOT", "1")))
    except ValueError:
        return 1


class Tiered:
    """Runs a program on NumPy until it is hot, then swaps in its compiled C function (the same
    bits: see "Floating-point contract" in the module docstring)."""

    def __init__(self, backend, program, numpy_run, remaining):
        self.backend, self.program, self.current, self.remaining = backend, program, numpy_run, remaining
        self.compiled = False

    writes_into = True
    _overwritable = None

    @property
    def overwritable(self) -> dict:
        """The results each run may compute in an argument's buffer (see ``lower.overwritable``):
        what both the NumPy run and the C function allow, so the answer holds before and after
        the switch."""
        if self._overwritable is None:
            allowed = getattr(self.current, "overwritable", {})
            if not self.compiled:
                c_allows = self._c_facts()[0]
                allowed = {j: ks & c_allows[j] for j, ks in allowed.items()
                           if ks & c_allows.get(j, set())}
            self._overwritable = allowed
        return self._overwritable

    def _c_facts(self):
        """``(overwritable, may_fail)`` of the C function it will switch to (lowered, not
        compiled); those of the NumPy run where C does not cover the program."""
        try:
            low = c_source(self.program)[1]
        except Unsupported:
            return getattr(self.current, "overwritable", {}), getattr(self.current, "may_fail", True)
        if _may_run_long(self.program) or low.warnings:
            return {}, True
        return low.overwritable, low.may_fail

    @property
    def views(self):
        """Per result, the arguments it may be a view of: the NumPy run's before the switch (more
        than the C function's, whose results are its own arrays, so an answer given then holds)."""
        return getattr(self.current, "views", None)

    @property
    def writes_directly(self) -> frozenset:
        """The results computed straight into a given destination, before and after the switch
        (the C function writes every one, unless it is interruptible)."""
        mine = getattr(self.current, "writes_directly", frozenset())
        if self.compiled:
            return mine
        return frozenset() if _may_run_long(self.program) else mine

    @property
    def may_fail(self) -> bool:
        """Whether a call may stop with an error, before or after the switch."""
        if self.compiled:
            return getattr(self.current, "may_fail", True)
        return getattr(self.current, "may_fail", True) or self._c_facts()[1]

    def __call__(self, args, into=None):
        if self.remaining <= 0 and not self.compiled:
            compiled = self.backend._compile_c(self.program)
            if compiled is None:                  # C does not cover it: NumPy for good
                self.backend.fallbacks += 1
            self.current = compiled or self.current
            self.compiled = True
            self.program = None
        self.remaining -= 1
        if into is not None and getattr(self.current, "writes_into", False):
            return self.current(args, into=into)
        return self.current(args)


#: the keys (their first item) of the programs a graph builds: a kernel batched over the samples,
#: a whole fused launch or reverse
GRAPH_PROGRAMS = frozenset({"graph", "graph-launch", "graph-reverse"})



def _differs_from_numpy(program) -> bool:
    """Whether ``program``'s C function may give other bits than its NumPy run: it holds a
    default-order matmul (BLAS's order on NumPy) or a libm function on floats.  Such a program is
    compiled at once, never switched from NumPy to C, so every call gives the same bits."""
    if any(True for _ in _blas_matmuls(program)):
        return True
    for e in program.eqns:
        if e.prim.name in INEXACT_PRIMITIVES and e.outputs[0].dtype.kind == "f":
            return True
        if any(hasattr(p, "eqns") and _differs_from_numpy(p) for p in e.params.values()):
            return True
    return False


#: element operations below which a program holding a scan is not armed for Ctrl-C: at most a
#: few milliseconds of C, while arming costs two ``sigaction`` calls (about a microsecond) on every
#: call -- a third of a jitted gradient's fixed cost at 10^3 rows
SHORT_WORK = 1 << 20

#: element operations (``_work``) of a program whose C function is called holding the GIL: a
#: few microseconds at most, less than other threads would gain from running meanwhile, and
#: releasing and taking back the GIL costs a tiny call a tenth of its time
QUICK_WORK = 1 << 14

#: a C function's ``vk_objs`` prototype for calls that keep the GIL (``CompiledProgram.quick``)
_HOLDING_GIL = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def _may_run_long(program) -> bool:
    """Whether a call may run long enough to be worth arming: it holds a while loop (its trip
    count is unknown) or its loops do more than ``SHORT_WORK`` element operations (roughly)."""
    return _has_loop(program) and _work(program) > SHORT_WORK


def _work(program) -> float:
    """Element operations ``program`` does, roughly and from above: each equation's largest
    operand (times the inner dimension for a matrix product or factorisation), a scan's step
    times its rows, every branch of a conditional; a while loop's are unbounded."""
    total = 0
    for e in program.eqns:
        name = e.prim.name
        if name == "while":
            return float("inf")
        nested = sum(_work(p) for p in e.params.values() if hasattr(p, "eqns"))
        if name == "scan":
            total += e.params["length"] * nested
            continue
        size = max([v.size for v in (*e.inputs, *e.outputs)] or [1])
        if name in ("matmul", "cholesky", "solve", "slogdet") and e.inputs and e.inputs[0].shape:
            size *= e.inputs[0].shape[-1]
        total += size + nested
    return total


def _has_loop(program) -> bool:
    for e in program.eqns:
        if e.prim.name in ("scan", "while"):
            return True
        if any(hasattr(p, "eqns") and _has_loop(p) for p in e.params.values()):
            return True
    return False


def gemm_threads() -> int:
    """The threads big products split their rows over, and a program's big loop nests their
    elements (``threaded_nests``) (``base.product_threads``: every core unless ``VKML_THREADS``
    says otherwise; read when a program is compiled) where GCC builds it with OpenMP; 1
    otherwise.  The bits do not change: each output is computed by one thread, in index order."""
    cc = compiler()
    return product_threads() if cc is not None and is_gcc(cc) else 1


def build_settings() -> tuple:
    """What a compiled program depends on beyond itself, read from the environment when it is
    compiled: the products' mode and threads (part of every executable's key, so a program
    compiled after ``VKML_FMA`` or ``VKML_THREADS`` changed is compiled for the new values; a
    function jitted before keeps the executables it has)."""
    env = os.environ
    return _build_settings(env.get("VKML_FMA"), env.get("VKML_THREADS"), env.get("CC"),
                           env.get("PATH"))


@functools.lru_cache(maxsize=16)
def _build_settings(*environment):
    return fused_products(), gemm_threads()


#: the GEMM libraries this process has loaded, by (element types, fused, threads)
_GEMM_LIBRARIES = {}


def gemm_library(types, fused, threads):
    """The GEMM as a library of its own for element ``types``, in the fused or plain mode,
    splitting big products over ``threads`` (built with OpenMP where more than one): built
    once and kept in the disk cache, loaded once per process, and called by every program's
    products through pointers (``codegen.gemm.library_source``) -- its 90 KB of C no longer
    compile with each program (0.3 s of every first call).  None where no folder could hold
    the build (the program then runs on NumPy)."""
    key = (types, fused, threads)
    lib = _GEMM_LIBRARIES.get(key)
    if lib is None:
        lib = _built(prelude() + library_source(types, fused), ["-fopenmp"] if threads > 1 else [],
                     generated=False)
        if lib is None:
            return None            # (not remembered: the folder may take the build next time)
        if threads > 1:
            ctypes.c_int.in_dll(lib, "vk_gemm_threads").value = threads
        lib = _GEMM_LIBRARIES.setdefault(key, lib)
    return lib


def _product_threads(lowering) -> int:
    """The threads a compiled program's products split over (1 when it has none)."""
    return lowering.gemm_threads if lowering.gemm_types else 1


class CpuBackend(Backend):
    """Programs compiled to C (see the module docstring); NumPy for what C does not cover."""

    name = "cpu"
    device = "CPU"

    def __init__(self):
        super().__init__()
        self.compiler = compiler()
        self.fallbacks = 0
        if self.compiler is None:
            warnings.warn("vkml: no C compiler found; the 'cpu' backend runs programs on NumPy",
                          RuntimeWarning, stacklevel=3)

    def _compile(self, program, math=frozenset()):
        if self.compiler is None:
            return self._numpy(program)
        hot = hot_threshold()
        if hot == 0 or _has_loop(program) or _differs_from_numpy(program):
            return self._compile_c(program, math) or self._numpy(program)
        return Tiered(self, program, self._numpy(program, fallback=False), hot)

    def _compile_c(self, program, math=frozenset(), blocks=True, split=True):
        """The program's C function, or None when the lowering does not cover it.  ``math``:
        the libm functions it calls in vector versions (``vector_math``).  Where the built
        library still calls one in a scalar (or a second vector) version -- a block loop the
        compiler left scalar -- it is built again with every call through a lane function (a
        loop of one call, which always vectorises), and only if that fails too with scalar
        libm throughout: one program never mixes the two, and a call gives the bits it gives
        in every other program.  Should a body cut into part functions not compile, it is
        built again whole (the same statements, the same bits)."""
        try:
            source, lowering = c_source(program, math, blocks, split)
        except Unsupported:
            return None
        vector = SIMD_MARKER in source
        gemm = None
        if lowering.gemm_types:
            gemm = gemm_library(tuple(sorted(lowering.gemm_types)), lowering.fused,
                                _product_threads(lowering))
            if gemm is None:
                return None
        flags = ["-fopenmp"] if THREADED_MARKER in source else \
            ["-fopenmp-simd"] if vector or SIMD_LOOP in source else []
        quick = wants_second_build(source, flags)
        imports = {}
        try:
            lib = _built(source, flags, _import_reader(math, vector, imports), quick=quick)
        except BackendError:
            if not split or "vk_part0(" not in source:
                raise
            return self._compile_c(program, math, blocks, split=False)
        if lib is None:
            return None
        if vector and not all_vector(imports):
            return self._compile_c(program, math, blocks=False, split=split) if blocks else \
                self._compile_c(program, split=split)
        compiled = CompiledProgram(program, lib, source, lowering, gemm)
        if quick:
            _build_later(compiled, source, flags, math, vector, imports)
        return compiled

    def _numpy(self, program, fallback=True):
        """The program on the NumPy backend: a fallback (counted in ``info()``) when C does not
        cover it or it is too big for generated loops; not one when it is a tiered program's
        first runs."""
        self.fallbacks += fallback
        STATS.compiles += 1
        return compile_numpy(program, self._compile_nested)

    def _compile_nested(self, program):
        return self.executable(("nested", program), lambda: program)

    def executable(self, key, make_program):
        # programs call libm in vector versions; which ones is part of their key
        # (VKML_VECTOR_MATH=0 set later gets programs of scalar libm, not ones built before);
        # so are the products' mode and threads (VKML_FMA, VKML_THREADS)
        math = self.graph_variant()
        key = key + build_settings()
        return self._cached(key + (math,) if math else key,
                            lambda: self._compile(check_sizes(make_program()), math),
                            from_disk=lambda exe: isinstance(exe, CompiledProgram))

    def graph_variant(self):
        """What a graph's programs are built with beyond their structure: the libm functions
        they call in vector versions (``vector_math``)."""
        return vector_math()

    def sample_loops(self, step, vjp, spec):
        """Compiled per-sample simulation loops (see ``codegen.sample_loops``), or None."""
        if self.compiler is None:
            return None

        def make():
            try:
                return SampleLoops(step, vjp, LoopSpec(**dict(spec)))
            except Unsupported:
                return False              # remembered: the lowering does not cover this step
        # the vector math in use is part of the key: VKML_VECTOR_MATH=0 set later gets loops of
        # scalar libm, not ones built before with vector math
        return self._cached(("sample-loops", step, vjp, spec, vector_math()), make) or None

    def info(self):
        info = super().info()
        math = "libmvec: " + " ".join(sorted(vector_math())) if vector_math() else "none (scalar libm)"
        flags = FLAGS + (GCC_FLAGS if self.compiler and is_gcc(self.compiler) else [])
        info.update({"compiler": self.compiler, "cache": cache_dir(), "flags": " ".join(flags),
                     "numpy fallbacks": self.fallbacks,
                     "products": ("fused multiply-add, k in index order (VKML_FMA=0: a rounded "
                                  "product then a rounded sum, the plain loops' bits)"
                                  if fused_products() else
                                  "a rounded product then a rounded sum, k in index order "
                                  "(the plain loops' bits; VKML_FMA=1 fuses them)"),
                     "threads": gemm_threads(),
                     "big programs": _big_programs(),
                     "simulation vector math": math,
                     "graph vector math": math,
                     "program vector math": math})
        return info


class SampleLoops:
    """A simulation's forward and reverse as two compiled functions over every sample."""

    def __init__(self, step, vjp, spec):
        self.step, self.n_state, self.window, self.wrt = step, spec.n_state, spec.window, spec.wrt
        try:
            self.vector_math = bool(vector_math()) and self._build(step, vjp, spec, vector_math())
        except BackendError:      # a compiler that refuses the vector declarations: scalar libm
            self.vector_math = False
        if not self.vector_math:
            self._build(step, vjp, spec, ())

    def _build(self, step, vjp, spec, math):
        """Compile the forward and the reverse, the libm functions ``math`` in vector versions.
        Returns whether they are in SIMD lanes with every such call a vector one, of one
        version per function in both: only then does the reverse recompute a window with the
        forward's very bits, whatever a compiler chose to vectorise.  Otherwise (the step can
        fail part-way, or the compiler left a call scalar) the caller builds again without."""
        self.errors = {"forward": [], "reverse": []}
        fwd = forward_source(step, spec, errors=self.errors["forward"], vector_math=math)
        rev = reverse_source(step, vjp, spec, errors=self.errors["reverse"], vector_math=math)
        simd = bool(math) and SIMD_MARKER in fwd and SIMD_MARKER in rev
        if math and not simd:
            return False
        imports = {}

        def inspect(data):
            for name, versions in math_imports(data, math).items():
                imports.setdefault(name, set()).update(versions)
        self._fwd_lib, _ = library(fwd, ["-fopenmp"], inspect)
        self._rev_lib, _ = library(rev, ["-fopenmp"], inspect)
        for fn in (self._fwd_lib.vk_fwd, self._rev_lib.vk_rev):
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        return simd and all_vector(imports)

    def _call(self, direction, fn, ins, outs, n, max_steps, threads):
        """One call of the compiled loops, interruptible (see the module docstring); a sample that
        failed (the lowest-numbered one) is raised as an ExecutionError naming the sample."""
        ins = [np.ascontiguousarray(a) for a in ins]
        in_ptrs = (ctypes.c_void_p * max(1, len(ins)))(*[a.ctypes.data for a in ins])
        out_ptrs = (ctypes.c_void_p * max(1, len(outs)))(*[o.ctypes.data for o in outs])
        info = np.array([n, max_steps, threads, 0, 0, 0, 0, 0], dtype=np.int64)
        STATS.submissions += 1
        with Armed() as stop:
            fn(in_ptrs, out_ptrs, info.ctypes.data, stop)
        code, sample = int(info[3]), int(info[7])
        if code == INTERRUPTED:
            interrupted()
        if code == ALLOCATION_FAILED:
            raise ExecutionError(f"the compiled simulation {direction}: could not allocate "
                                 f"{int(info[4])} bytes for sample {sample}'s window of "
                                 f"{self.window} steps; pass a smaller window=")
        if code:
            error = failure_error(self.errors[direction][code - 1], info[4:7])
            raise ExecutionError(f"the compiled simulation {direction}: a step of sample {sample} "
                                 f"failed in {self.errors[direction][code - 1]}: {error}")

    def _empty(self, direction, shape, dtype):
        """``np.empty``, with a refused allocation an ExecutionError (MemoryError from NumPy)."""
        try:
            return np.empty(shape, dtype)
        except (MemoryError, ValueError):
            raise ExecutionError(f"the compiled simulation {direction}: "
                                 f"{allocation_error('its buffers', shape, dtype)}") from None

    def forward(self, states, fixed, others, params, max_steps, threads):
        """Final states, per-sample steps, the checkpoints every ``window`` steps; the last step's
        other outputs are written into ``others`` (their planes), unless a sample fails."""
        n = states[0].shape[0]
        n_ck = -(-max_steps // self.window)
        finals = [np.empty_like(s) for s in states]
        steps = np.zeros(n, np.int64)
        cks = [self._empty("forward", (n_ck,) + s.shape, s.dtype) for s in states]
        extra = [np.ascontiguousarray(o).copy() for o in others]
        self._call("forward", self._fwd_lib.vk_fwd, list(states) + list(fixed) + list(params),
                   finals + [steps] + cks + extra, n, max_steps, threads)
        for plane, value in zip(others, extra):
            plane[...] = value
        return finals, steps, cks

    def reverse(self, checkpoints, steps, fixed, params, seeds, threads):
        """Per-sample cotangents of the wrt inputs (states, floating fixed planes, Params)."""
        n = steps.shape[0]
        ins = self.step.inputs
        outs = [self._empty("reverse", (n,) + ins[w].shape, ins[w].dtype) for w in self.wrt]
        self._call("reverse", self._rev_lib.vk_rev, list(checkpoints) + [steps] + list(fixed)
                   + list(params) + list(seeds), outs, n, 0, threads)
        return outs


def _why_default():
    """Why this tier is the default backend here (a C compiler was found), or None."""
    cc = compiler()
    return f"a C compiler was found ({cc}), so programs run as compiled C" if cc else None


register("cpu", CpuBackend, preferred_because=_why_default)
