"""Per-sample simulation loops: one function (C, or a CUDA kernel) runs every step of every sample.

A simulation on the NumPy backend is a Python loop over steps, each step a
batched program (tens of microseconds of host work per step).  Here the
step kernel's per-sample program is lowered to scalar C and wrapped in
``for sample: for step: ...`` -- one thread per sample, as GPU simulation codes that step each sample in its own thread do -- so
the state stays in registers, a sample stops at its own ``terminated``, and
the recorded checkpoints are written as the loop passes them.  Where a step
cannot fail part-way, a C thread steps ``VK_LANES`` samples in turn (see
:data:`LANES`): each still does its own operations in its own order; on the
cpu tier with glibc's vector math the lanes step together in SIMD registers
(:func:`_forward_simd`, ``vector_math``).  The reverse
is one function too: per sample, each window from the last is recomputed
from its checkpoint into a local buffer and the adjoint is stepped back
through it with the kernel's per-sample vjp program.

Samples never mix, so splitting them over threads (``VKML_THREADS``,
OpenMP) changes no bit.  Per-sample Param cotangents are returned, and the
graph layer sums them with the canonical tree.

Two dialects of the same loops: ``target="c"`` for the cpu tier
(``cpu.SampleLoops``; ``int vk_fwd(void** in, void** out, int64_t* info,
const volatile int* vk_stop)``, the samples split over OpenMP threads) and
``target="cuda"`` for the CUDA backend (``cuda_loops.CudaSampleLoops``;
``extern "C" __global__ void
vk_fwd(void* const* in, void* const* out, long long n, long long max_steps)``
with device pointer tables, one GPU thread per sample in a grid-stride
loop, a thread's state and window in local memory -- a window too large
for it is refused, :data:`CUDA_LOCAL_LIMIT`).  Only the frame differs --
prelude, constants, signature, the loop over samples, the return -- and it
is written once, in the helpers below.

A failure inside a step (a gather index out of range, a negative integer
power) stops that sample and is reported, never skipped: in C through
``info[3:8]`` (code, the three detail words, the sample; the lowest failing
sample wins, whatever the threads), in CUDA through a status array of four
words after the outputs (see ``kernels_cu/prelude.cuh``).  The reverse's
window, whose size the user chooses, is on the heap in C (allocated per
sample and checked: a refusal is reported as code
:data:`~.c_render.ALLOCATION_FAILED` with its bytes), never on the stack;
every other per-sample buffer is at most :data:`~.c_render.STACK_LIMIT`
elements.

Interrupts (C only): the function's fourth argument is the interrupt flag
(``backends.interrupts``), polled before every step a sample takes, forward,
recomputed or reversed (and in every scan row or while iteration inside a
step).  Once it is set, every thread's samples stop at their next poll,
free their windows and report :data:`~.c_render.INTERRUPTED`, so the call
returns within a step of the interrupt; the caller commits nothing of it.
A CUDA kernel cannot be stopped from the host: it runs to its end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .c_render import ALLOCATION_FAILED, INTERRUPTED, STACK_LIMIT, emit, prelude
from .cuda_render import prelude as cuda_prelude
from .lower import CTYPE, Lowering, Unsupported
# the vector math every compiled loop shares (SIMD_MARKER and VECTOR_MATH are read from here too)
from .vector_nests import SIMD_MARKER, VECTOR_MATH, simd_declarations  # noqa: F401


@dataclass(frozen=True)
class LoopSpec:
    """What a simulation's per-sample loops need to know of its step besides its programs: how
    its inputs split (state, fixed, Params), which outputs are the new state and which says a
    sample terminated, the inputs it differentiates by, and the reverse's window."""
    n_state: int
    n_fixed: int
    n_params: int
    out_names: tuple
    state_names: tuple
    term_index: int | None
    wrt: tuple
    window: int


class ForwardNest(NamedTuple):
    """The forward step lowered, and what its loop reads and writes (see ``_lower_forward``)."""
    low: object
    body: list
    st_vars: list
    outs: list
    new_of: dict
    extra: list
    term_index: int | None
    window: int


class ReverseNest(NamedTuple):
    """The step and its vjp lowered for the reverse loop (see ``_lower_reverse``)."""
    fwd_low: object
    fwd_body: list
    bwd_low: object
    bwd_body: list
    ins: list
    st_vars: list
    outs: list
    new_of: dict
    wrt: tuple
    window: int


def _size(v):
    return max(1, int(np.prod(v.shape, dtype=np.int64)))


def _check_small(low, *planes):
    """Refuse (Unsupported) per-sample buffers too large for a thread's stack: the lowering's
    temporaries and the step's own per-sample values (``planes``: lists of Vars)."""
    sizes = [count for _, _, count in low.temps] + [_size(v) for vs in planes for v in vs]
    if any(count > STACK_LIMIT for count in sizes):
        raise Unsupported("a per-sample temporary too large for the stack")


#: bytes of window buffers a GPU thread may hold in local memory (the driver reserves a kernel's
#: frame for every thread that can be resident: 32 KiB is about 8 GiB on a 132-SM GPU; it holds
#: the default window, at most 1024 steps, of four float64 scalars)
CUDA_LOCAL_LIMIT = 32 * 1024


def _check_local(st_vars, window, target):
    """Refuse (Unsupported) a reverse whose per-thread window buffers do not fit a GPU thread."""
    if target == "cuda" and sum(window * _size(v) * np.dtype(v.dtype).itemsize
                                for v in st_vars) > CUDA_LOCAL_LIMIT:
        raise Unsupported("a window too large for a GPU thread's local memory")


def _ptr(name, var, slot, const=False):
    """A typed pointer to one of the function's buffers."""
    q = "const " if const else ""
    return f"    {q}{CTYPE[var.dtype]}* {name} = ({q}{CTYPE[var.dtype]}*){slot};"


# -- the two dialects: only the function's frame differs; the loops inside are the same text ------

#: Samples a C thread steps together, one step of each in turn.  A sample's own steps form one long
#: chain of dependent operations (a step needs the last one's state), so stepping one sample at a
#: time leaves the processor waiting on each result; independent samples' steps overlap.  Each
#: sample still does exactly its own operations in its own order: the bits do not change.  A GPU
#: thread steps one sample (``VK_LANES`` is 1 there): the GPU overlaps samples across threads.
LANES = 8

# How a sample reports a failure, and where a window lives, in each dialect: the loops call these
# by the same names, so their text is the same in both.
_C_FRAME = f"""
static void vk_sample_failed(int64_t* report, int code, const int64_t* info, int64_t s) {{
    #pragma omp critical(vk_sample_failed)
    if (report[0] == 0 || s < report[4]) {{
        report[0] = code; report[1] = info[0]; report[2] = info[1]; report[3] = info[2]; report[4] = s;
    }}
}}
#define VK_LANES {LANES}
#define VK_WINDOW(T, name, count) T* name = 0
#define VK_WINDOW_ALLOC(T, name, count) name = (T*)malloc(sizeof(T) * (unsigned long long)(count)); \\
    if (!name) {{ err_ = {ALLOCATION_FAILED}; info[0] = (int64_t)(sizeof(T) * (unsigned long long)(count)); \\
                 info[1] = 0; info[2] = 0; goto done; }}
#define VK_WINDOW_FREE(name) free(name)
#define VK_POLL_INTERRUPT if (*vk_stop) {{ err_ = {INTERRUPTED}; goto done; }} else (void)0
"""
_CUDA_FRAME = """
#define VK_LANES 1
VK_DEV void vk_sample_failed(unsigned long long* report, int code, const int64_t* info, int64_t s) {
    (void)s; vk_report(report, code, info);
}
#define VK_WINDOW(T, name, count) T name[count]
#define VK_WINDOW_ALLOC(T, name, count) (void)0
#define VK_WINDOW_FREE(name) (void)0
#define VK_POLL_INTERRUPT (void)0
"""


def _open_function(target, name, statics, n_out):
    """The file up to the function body: prelude, the programs' constants, the signature, and
    where ``n``, ``max_steps`` and the failure report (``vk_report_to``) come from; ``n_out``:
    the outputs before the CUDA status words."""
    if target == "c":
        return [prelude(), _C_FRAME] + statics + \
            [f"int {name}(void** in, void** out, int64_t* info, const volatile int* vk_stop) {{",
             "    int64_t n = info[0], max_steps = info[1]; int64_t* vk_report_to = info + 3;"]
    if target != "cuda":
        raise ValueError(f"sample loops are generated as 'c' or 'cuda', not {target!r}")
    # in/out are device pointer tables; n and max_steps are kernel arguments.  A zero cotangent
    # the vjp does not read (a "terminated" flag's) is declared all the same: no warning for it.
    return [cuda_prelude(), _CUDA_FRAME, "#ifdef __CUDACC__", "#pragma nv_diag_suppress 177",
            "#endif"] + \
        [s.replace("static const ", "__device__ const ", 1) for s in statics] + \
        [f'extern "C" __global__ void {name}(void* const* in, void* const* out, long long n, '
         f"long long max_steps) {{ unsigned long long* vk_report_to = "
         f"(unsigned long long*)out[{n_out}];"]


def _open_sample_loop(lines, target, lanes=False):
    """The loop over samples -- split over ``info[2]`` OpenMP threads in C, one GPU thread per
    sample (grid-stride) in CUDA; ``lanes``: over groups of ``VK_LANES`` samples starting at
    ``s``.  Returns the body's indent."""
    if target == "c":
        lines.append("    #pragma omp parallel for num_threads((int)info[2]) schedule(static)")
        lines.append("    for (int64_t s = 0; s < n; s += VK_LANES) {" if lanes else
                     "    for (int64_t s = 0; s < n; s++) {")
    elif lanes:
        lines.append("    for (int64_t s = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * VK_LANES; "
                     "s < n; s += (int64_t)blockDim.x * gridDim.x * VK_LANES) {")
    else:
        lines.append("    for (int64_t s = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; s < n; "
                     "s += (int64_t)blockDim.x * gridDim.x) {")
    # a failure writes its details to the sample's own info, reported when the sample stops
    lines.append("        int err_ = 0; int* err = &err_; (void)err; "
                 "int64_t info[3] = {0, 0, 0}; (void)info;")
    return "        "


def _close_function(lines, target, windows=()):
    """The end of the sample loop (its windows freed, its failure reported) and of the
    function."""
    lines.append("        goto done; done: (void)0;")
    for name in windows:
        lines.append(f"        VK_WINDOW_FREE({name});")
    lines.append("        if (err_) vk_sample_failed(vk_report_to, err_, info, s);")
    lines.append("    }")
    lines.append("    return 0;" if target == "c" else "    return;")
    lines.append("}")


#: the interrupt poll, before a step and inside a step's scans and while loops: the same text in
#: both dialects, a poll of the flag in C and nothing in CUDA (a kernel has no flag to poll)
_POLL = "VK_POLL_INTERRUPT;"


def _lowering():
    """A lowering of a step whose scans and while loops poll the interrupt flag."""
    low = Lowering()
    low.interrupt_poll = _POLL
    return low


def _decl_temps(low, lines, ind):
    for name, ctype, count in low.temps:
        lines.append(f"{ind}{ctype} {name}[{count}];")


def _split(step, n_state, n_fixed):
    """The step's inputs as state planes, fixed planes and Params, and its outputs."""
    ins = step.inputs
    return ins[:n_state], ins[n_state:n_state + n_fixed], ins[n_state + n_fixed:], step.outputs


def _state_outputs(out_names, state_names):
    """State plane ``i`` -> the step output that is its next value."""
    return {i: out_names.index(name) for i, name in enumerate(state_names)}


def _sample(lanes, simd=False):
    """The sample a loop body works on and the row of its per-sample state: ``s`` itself, or, in
    lanes, sample ``s + l`` in row ``l`` (in SIMD lanes, ``row[l]``: a padding lane past the
    last sample reads sample ``s``'s fixed planes)."""
    if simd:
        return ("row[l]", "[l]")
    return ("(s + l)", "[l]") if lanes else ("s", "")


def _steps_in_lanes(*lows_and_bodies):
    """Whether bodies can run in lanes: none can fail (a failure stops one sample, not its
    lane group) and none polls the interrupt inside (no scan or while loop in the step)."""
    for low, body in lows_and_bodies:
        if low.errors:
            return False
        text = []
        emit(body, text, "")
        if any(_POLL in line for line in text):
            return False
    return True


def forward_source(step, spec: LoopSpec, target="c", errors=None, vector_math=()):
    """``vk_fwd``: in = state planes, fixed planes, params; out = final state planes,
    steps (int64, one per sample), then one checkpoint array per state plane
    (``[ceil(max_steps / window), n, ...]``), then the last step's other outputs.
    C: ``int vk_fwd(void** in, void** out, int64_t* info, const volatile int* vk_stop)`` with
    ``info = [n, max_steps, threads, 0, 0, 0, 0, 0]`` (the last five: the failure report) and
    the interrupt flag; CUDA: ``vk_fwd(in, out, n, max_steps)`` with device pointer tables, the
    status words after the outputs.  ``errors``: a list the primitive names of the error codes
    are appended to.  Where the step cannot fail part-way, a thread steps ``VK_LANES`` samples
    in turn (:func:`_forward_lanes`), else one (:func:`_forward_samples`); ``vector_math``
    (C only): the libm functions to call in their vector versions, the lanes then stepped
    across SIMD registers (:func:`_forward_simd`)."""
    n_state, n_fixed, n_params = spec.n_state, spec.n_fixed, spec.n_params
    low, body = _lower_forward(step, n_state, n_fixed, n_params, lanes=True)
    lanes = _steps_in_lanes((low, body))
    simd = lanes and target == "c" and bool(vector_math)
    if simd:
        low, body = _lower_forward(step, n_state, n_fixed, n_params, lanes=True, simd=True)
    if not lanes:
        low, body = _lower_forward(step, n_state, n_fixed, n_params, lanes=False)
        if errors is not None:
            errors.extend(low.errors)
    st_vars, fx_vars, pr_vars, outs = _split(step, n_state, n_fixed)
    new_of = _state_outputs(spec.out_names, spec.state_names)
    extra = [j for j in range(len(outs)) if j not in new_of.values()]
    statics = (simd_declarations(vector_math) if simd else []) + low.statics
    lines = _open_function(target, "vk_fwd", statics, 2 * n_state + 1 + len(extra))
    for i, v in enumerate(st_vars):
        lines.append(_ptr(f"si{i}", v, f"in[{i}]", const=True))
        lines.append(_ptr(f"so{i}", v, f"out[{i}]"))
        lines.append(_ptr(f"ck{i}", v, f"out[{n_state + 1 + i}]"))
    for i, v in enumerate(fx_vars):
        lines.append(_ptr(f"f{i}", v, f"in[{n_state + i}]", const=True))
    for i, v in enumerate(pr_vars):
        lines.append(_ptr(f"p{i}", v, f"in[{n_state + n_fixed + i}]"))
    lines.append(f"    int64_t* steps = (int64_t*)out[{n_state}];")
    ind = _open_sample_loop(lines, target, lanes=lanes)
    loop = _forward_simd if simd else _forward_lanes if lanes else _forward_samples
    loop(lines, ind, ForwardNest(low, body, st_vars, outs, new_of, extra, spec.term_index, spec.window))
    _close_function(lines, target)
    return "\n".join(lines) + "\n"


def _lower_forward(step, n_state, n_fixed, n_params, lanes, simd=False):
    """The step lowered for the forward loop (reading the state ``st{i}``, writing ``ot{j}``),
    its per-sample buffers checked: (lowering, body)."""
    sample, row = _sample(lanes, simd)
    st_vars, fx_vars, _, outs = _split(step, n_state, n_fixed)
    low = _lowering()
    in_ptrs = [f"st{i}{row}" for i in range(n_state)] + \
        [f"(f{i} + {sample} * {_size(v)})" for i, v in enumerate(fx_vars)] + \
        [f"p{i}" for i in range(n_params)]
    body = low.program(step, in_ptrs, [f"ot{i}" for i in range(len(outs))])
    _check_small(low, st_vars, outs)
    return low, body


def _forward_samples(lines, ind, nest):
    """The forward loop's body for one sample ``s``: its steps until ``max_steps`` or its
    ``terminated``, a checkpoint at the start of every window."""
    low, body, st_vars, outs, new_of, extra, term_index, window = nest
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}{CTYPE[v.dtype]} st{i}[{k}];")
        lines.append(f"{ind}for (int64_t c = 0; c < {k}; c++) st{i}[c] = si{i}[s * {k} + c];")
    for i, v in enumerate(outs):
        lines.append(f"{ind}{CTYPE[v.dtype]} ot{i}[{_size(v)}];")
    _decl_temps(low, lines, ind)
    lines.append(f"{ind}int64_t t = 0;")
    lines.append(f"{ind}for (; t < max_steps; t++) {{")
    lines.append(ind + "    " + _POLL)
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}    if (t % {window} == 0) for (int64_t c = 0; c < {k}; c++) "
                     f"ck{i}[((t / {window}) * n + s) * {k} + c] = st{i}[c];")
    emit(body, lines, ind + "    ")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}    for (int64_t c = 0; c < {k}; c++) st{i}[c] = ot{new_of[i]}[c];")
    if term_index is not None:
        lines.append(f"{ind}    if (ot{term_index}[0]) {{ t++; break; }}")
    lines.append(f"{ind}}}")
    lines.append(f"{ind}steps[s] = t;")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}for (int64_t c = 0; c < {k}; c++) so{i}[s * {k} + c] = st{i}[c];")
    _checkpoints_after_stop(lines, ind, st_vars, window, "t", "s", lambda i: f"st{i}")
    # the last step's other outputs (a "terminated" flag, say), as the NumPy path leaves them
    for m, j in enumerate(extra):
        k = _size(outs[j])
        lines.append(f"{ind}if (t > 0) for (int64_t c = 0; c < {k}; c++) "
                     f"(({CTYPE[outs[j].dtype]}*)out[{2 * len(st_vars) + 1 + m}])[s * {k} + c] = ot{j}[c];")


def _checkpoints_after_stop(lines, ind, st_vars, window, taken, sample, state):
    """A sample that stopped before ``max_steps`` holds its last state from then on: the
    checkpoints of the windows it did not reach get that state (as the NumPy backend keeps a
    stopped sample's state in every later checkpoint), never uninitialised memory."""
    lines.append(f"{ind}for (int64_t w = ({taken} + {window} - 1) / {window}; "
                 f"w < (max_steps + {window} - 1) / {window}; w++) {{")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}    for (int64_t c = 0; c < {k}; c++) "
                     f"ck{i}[(w * n + {sample}) * {k} + c] = {state(i)}[c];")
    lines.append(f"{ind}}}")


def _forward_lanes(lines, ind, nest):
    """The forward loop's body for the ``VK_LANES`` samples from ``s``, one step of each in turn
    (see :data:`LANES`).  Sample ``s + l`` keeps its state in row ``l``; a terminated sample's
    row is skipped from then on."""
    low, body, st_vars, outs, new_of, extra, term_index, window = nest
    for i, v in enumerate(st_vars):
        lines.append(f"{ind}{CTYPE[v.dtype]} st{i}[VK_LANES][{_size(v)}];")
    for m, j in enumerate(extra):
        lines.append(f"{ind}{CTYPE[outs[j].dtype]} ex{m}[VK_LANES][{_size(outs[j])}];")
    lines.append(f"{ind}int64_t taken[VK_LANES]; int running[VK_LANES];")
    lines.append(f"{ind}for (int l = 0; l < VK_LANES; l++) {{")
    lines.append(f"{ind}    taken[l] = 0; running[l] = s + l < n;")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}    if (running[l]) for (int64_t c = 0; c < {k}; c++) "
                     f"st{i}[l][c] = si{i}[(s + l) * {k} + c];")
    lines.append(f"{ind}}}")
    lines.append(f"{ind}for (int64_t t = 0; t < max_steps; t++) {{")
    lines.append(ind + "    " + _POLL)
    lines.append(f"{ind}    int any_running = 0;")
    lines.append(f"{ind}    for (int l = 0; l < VK_LANES; l++) {{")
    li = ind + "        "
    lines.append(f"{li}if (!running[l]) continue;")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{li}if (t % {window} == 0) for (int64_t c = 0; c < {k}; c++) "
                     f"ck{i}[((t / {window}) * n + s + l) * {k} + c] = st{i}[l][c];")
    for i, v in enumerate(outs):
        lines.append(f"{li}{CTYPE[v.dtype]} ot{i}[{_size(v)}];")
    _decl_temps(low, lines, li)
    emit(body, lines, li)
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{li}for (int64_t c = 0; c < {k}; c++) st{i}[l][c] = ot{new_of[i]}[c];")
    for m, j in enumerate(extra):
        lines.append(f"{li}for (int64_t c = 0; c < {_size(outs[j])}; c++) ex{m}[l][c] = ot{j}[c];")
    lines.append(f"{li}taken[l] = t + 1;")
    if term_index is not None:
        lines.append(f"{li}if (ot{term_index}[0]) running[l] = 0;")
    lines.append(f"{li}any_running |= running[l];")
    lines.append(f"{ind}    }}")
    lines.append(f"{ind}    if (!any_running) break;")
    lines.append(f"{ind}}}")
    _lanes_results(lines, ind, st_vars, outs, extra, window)


def _lanes_results(lines, ind, st_vars, outs, extra, window):
    """The end of a forward lanes loop: each real sample's steps, final state, the checkpoints
    after its stop and the last step's other outputs, from its row ``l``."""
    lines.append(f"{ind}for (int l = 0; l < VK_LANES && s + l < n; l++) {{")
    lines.append(f"{ind}    steps[s + l] = taken[l];")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}    for (int64_t c = 0; c < {k}; c++) so{i}[(s + l) * {k} + c] = st{i}[l][c];")
    _checkpoints_after_stop(lines, ind + "    ", st_vars, window, "taken[l]", "(s + l)",
                            lambda i: f"st{i}[l]")
    # the last step's other outputs (a "terminated" flag, say), as the NumPy path leaves them
    for m, j in enumerate(extra):
        k = _size(outs[j])
        lines.append(f"{ind}    if (taken[l] > 0) for (int64_t c = 0; c < {k}; c++) "
                     f"(({CTYPE[outs[j].dtype]}*)out[{2 * len(st_vars) + 1 + m}])[(s + l) * {k} + c] = ex{m}[l][c];")
    lines.append(f"{ind}}}")


# -- SIMD lanes (C): every lane takes every step, the libm calls in their vector versions -------


def _keep_if(lines, ind, on, dst, src, k):
    """``dst = src`` where ``on`` holds, else ``dst`` kept (a select)."""
    lines.append(_per_element(ind, k, lambda c: f"{dst}[{c}] = {on} ? {src}[{c}] : {dst}[{c}];"))


def _simd_lanes_loop(lines, ind, low, body, decls, results):
    """A ``#pragma omp simd`` loop over the lanes computing ``body`` for each (its values
    declared by ``decls``, lines without indent), storing every lane's ``results`` (``(lane
    array, value, elements)``) unconditionally.  No branch and no select in it: GCC 12
    vectorises a loop with a condition only if its calls are builtins, and the selects that
    keep a stopped lane's values are done after it, in a loop of their own (:func:`_keep_if`).
    Each single element is assigned without an inner loop, which would keep it scalar at -O2."""
    lines.append(f"{ind}#pragma omp simd")
    lines.append(f"{ind}for (int l = 0; l < VK_LANES; l++) {{")
    li = ind + "    "
    lines += [li + d for d in decls]
    _decl_temps(low, lines, li)
    emit(body, lines, li)
    for dst, src, k in results:
        lines.append(_per_element(li, k, lambda c: f"{dst}[l][{c}] = {src}[{c}];"))
    lines.append(f"{ind}}}")


def _per_element(ind, k, assign):
    """``assign(c)`` for each of ``k`` elements: a loop, or the one statement when ``k`` is 1."""
    if k == 1:
        return ind + assign("0")
    return f"{ind}for (int64_t c = 0; c < {k}; c++) {assign('c')}"


def _lane_type(dtype):
    """The C type a lane keeps a value of ``dtype`` in across steps: an integer narrower than 64
    bits (a "terminated" flag) widened to int64_t, since GCC vectorises no loop over double lanes
    that stores bytes (the value is the same; it is narrowed back when written out)."""
    dtype = np.dtype(dtype)
    return "int64_t" if dtype.kind in "biu" and dtype.itemsize < 8 else CTYPE[dtype]


def _forward_simd(lines, ind, nest):
    """The forward loop's body for the ``VK_LANES`` samples from ``s``, the lanes stepped together
    across SIMD registers (:func:`_simd_lanes_loop`).  Every lane computes every step, so every
    sample goes through the very same vector calls wherever it sits: a lane past the last sample
    steps a copy of sample ``s`` (its fixed planes through ``row[l]``), a stopped sample's steps
    are computed and discarded, and nothing traps.  So a sample's bits do not depend on ``n``,
    the threads or the passes it is run in."""
    low, body, st_vars, outs, new_of, extra, term_index, window = nest
    for i, v in enumerate(st_vars):
        lines.append(f"{ind}{CTYPE[v.dtype]} st{i}[VK_LANES][{_size(v)}], nt{i}[VK_LANES][{_size(v)}];")
    for m, j in enumerate(extra):
        ctype, k = _lane_type(outs[j].dtype), _size(outs[j])
        lines.append(f"{ind}{ctype} ex{m}[VK_LANES][{k}], nex{m}[VK_LANES][{k}];")
    lines.append(f"{ind}int64_t taken[VK_LANES], running[VK_LANES], row[VK_LANES], "
                 f"stops[VK_LANES][1];")
    lines.append(f"{ind}for (int l = 0; l < VK_LANES; l++) {{")
    lines.append(f"{ind}    taken[l] = 0; running[l] = s + l < n; row[l] = running[l] ? s + l : s;")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}    for (int64_t c = 0; c < {k}; c++) st{i}[l][c] = si{i}[row[l] * {k} + c];")
    for m, j in enumerate(extra):
        lines.append(f"{ind}    for (int64_t c = 0; c < {_size(outs[j])}; c++) ex{m}[l][c] = 0;")
    lines.append(f"{ind}}}")
    lines.append(f"{ind}for (int64_t t = 0; t < max_steps; t++) {{")
    lines.append(ind + "    " + _POLL)
    lines.append(f"{ind}    if (t % {window} == 0) for (int l = 0; l < VK_LANES; l++) {{")
    lines.append(f"{ind}        if (!running[l]) continue;")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}        for (int64_t c = 0; c < {k}; c++) "
                     f"ck{i}[((t / {window}) * n + s + l) * {k} + c] = st{i}[l][c];")
    lines.append(f"{ind}    }}")
    decls = [f"{CTYPE[v.dtype]} ot{j}[{_size(v)}];" for j, v in enumerate(outs)]
    results = [(f"nt{i}", f"ot{new_of[i]}", _size(v)) for i, v in enumerate(st_vars)]
    results += [(f"nex{m}", f"ot{j}", _size(outs[j])) for m, j in enumerate(extra)]
    if term_index is not None:
        results.append(("stops", f"ot{term_index}", 1))
    _simd_lanes_loop(lines, ind + "    ", low, body, decls, results)
    lines.append(f"{ind}    int64_t any_running = 0;")
    lines.append(f"{ind}    for (int l = 0; l < VK_LANES; l++) {{")
    li = ind + "        "
    lines.append(f"{li}int64_t on = running[l];")
    for i, v in enumerate(st_vars):
        _keep_if(lines, li, "on", f"st{i}[l]", f"nt{i}[l]", _size(v))
    for m, j in enumerate(extra):
        _keep_if(lines, li, "on", f"ex{m}[l]", f"nex{m}[l]", _size(outs[j]))
    lines.append(f"{li}taken[l] = on ? t + 1 : taken[l];")
    if term_index is not None:
        lines.append(f"{li}running[l] = on & (stops[l][0] == 0);")
    lines.append(f"{li}any_running |= running[l];")
    lines.append(f"{ind}    }}")
    lines.append(f"{ind}    if (!any_running) break;")
    lines.append(f"{ind}}}")
    _lanes_results(lines, ind, st_vars, outs, extra, window)


def reverse_source(step, vjp, spec: LoopSpec, target="c", errors=None, vector_math=()):
    """``vk_rev``: in = checkpoints per state plane, steps, fixed planes, params,
    seeds per state plane; out = state gradients, then gradients of the floating fixed planes and
    per-sample Param cotangents (in ``wrt`` order).  Called as ``vk_fwd`` is (``max_steps``
    unused).  Where neither the step nor its vjp can fail part-way, a thread reverses
    ``VK_LANES`` samples together (:func:`_reverse_lanes`), else one (:func:`_reverse_samples`);
    ``vector_math`` as for :func:`forward_source` (:func:`_reverse_simd`)."""
    n_state, n_fixed, wrt, window = spec.n_state, spec.n_fixed, spec.wrt, spec.window
    fwd_low, fwd_body, bwd_low, bwd_body = _lower_reverse(step, vjp, spec, lanes=True)
    lanes = _steps_in_lanes((fwd_low, fwd_body), (bwd_low, bwd_body))
    simd = lanes and target == "c" and bool(vector_math)
    if simd:
        fwd_low, fwd_body, bwd_low, bwd_body = _lower_reverse(step, vjp, spec, lanes=True, simd=True)
    if not lanes:
        fwd_low, fwd_body, bwd_low, bwd_body = _lower_reverse(step, vjp, spec, lanes=False)
        if errors is not None:
            errors.extend(fwd_low.errors)
    ins = step.inputs
    st_vars, fx_vars, pr_vars, outs = _split(step, n_state, n_fixed)
    _check_local(st_vars, window, target)
    statics = (simd_declarations(vector_math) if simd else []) + fwd_low.statics + bwd_low.statics
    lines = _open_function(target, "vk_rev", statics, len(wrt))
    pos = 0
    for i, v in enumerate(st_vars):
        lines.append(_ptr(f"ck{i}", v, f"in[{pos}]", const=True))
        pos += 1
    lines.append(f"    const int64_t* steps = (const int64_t*)in[{pos}];")
    pos += 1
    for i, v in enumerate(fx_vars):
        lines.append(_ptr(f"f{i}", v, f"in[{pos}]", const=True))
        pos += 1
    for i, v in enumerate(pr_vars):
        lines.append(_ptr(f"p{i}", v, f"in[{pos}]"))
        pos += 1
    for i, v in enumerate(st_vars):
        lines.append(_ptr(f"seed{i}", v, f"in[{pos}]", const=True))
        pos += 1
    for k, w_pos in enumerate(wrt):
        lines.append(_ptr(f"go{k}", ins[w_pos], f"out[{k}]"))
    ind = _open_sample_loop(lines, target, lanes=lanes)
    loop = _reverse_simd if simd else _reverse_lanes if lanes else _reverse_samples
    loop(lines, ind, ReverseNest(fwd_low, fwd_body, bwd_low, bwd_body, ins, st_vars, outs,
                                 _state_outputs(spec.out_names, spec.state_names), wrt, window))
    _close_function(lines, target, [f"buf{i}" for i in range(n_state)])
    return "\n".join(lines) + "\n"


def _lower_reverse(step, vjp, spec, lanes, simd=False):
    """The step and its vjp lowered for the reverse loop, their per-sample buffers checked:
    (forward lowering, forward body, vjp lowering, vjp body).  The step recomputes a window from
    ``cur{i}`` into ``nx{j}``; the vjp reads the state held in the window buffer ``buf{i}`` and the
    cotangents ``ct{i}`` (``zo{j}``, zeros, for the outputs that are no state) and writes
    ``g{k}``."""
    n_state, n_params, wrt, window = spec.n_state, spec.n_params, spec.wrt, spec.window
    sample, row = _sample(lanes, simd)
    ins = step.inputs
    st_vars, fx_vars, _, outs = _split(step, n_state, spec.n_fixed)
    new_of = _state_outputs(spec.out_names, spec.state_names)
    fwd_low = _lowering()
    fx_ptr = [f"(f{i} + {sample} * {_size(v)})" for i, v in enumerate(fx_vars)]
    pr_ptr = [f"p{i}" for i in range(n_params)]
    fwd_body = fwd_low.program(step, [f"cur{i}{row}" for i in range(n_state)] + fx_ptr + pr_ptr,
                               [f"nx{i}" for i in range(len(outs))])
    bwd_low = _lowering()
    bwd_low.counter = 10000                   # distinct temporary names from the forward body
    bwd_low.errors = fwd_low.errors           # one numbering of the error codes for both bodies
    # the window buffers: a sample's steps in a row; in SIMD lanes, the lanes of a step in a row
    # (the lanes' loop then reads them contiguously, not strided: GCC 12 keeps a strided read
    # scalar there)
    held = "(t - w) * VK_LANES + l" if simd else f"l * {window} + (t - w)" if lanes else "t - w"
    state_at = [f"(buf{i} + ({held}) * {_size(v)})" for i, v in enumerate(st_vars)]
    ct_in = []
    for j, v in enumerate(outs):
        if j in new_of.values():
            i = [k for k, o in new_of.items() if o == j][0]
            ct_in.append(f"ct{i}{row}")
        else:
            ct_in.append(f"zo{j}")
    grads = [f"g{k}" for k in range(len(wrt))]
    bwd_body = bwd_low.program(vjp, state_at + fx_ptr + pr_ptr + ct_in, grads)
    _check_small(fwd_low, st_vars, outs)
    _check_small(bwd_low, [ins[w] for w in wrt])
    return fwd_low, fwd_body, bwd_low, bwd_body


def _reverse_samples(lines, ind, nest):
    """The reverse loop's body for one sample ``s``: each window from the last recomputed from its
    checkpoint into ``buf{i}``, then the adjoint stepped back through it."""
    fwd_low, fwd_body, bwd_low, bwd_body, ins, st_vars, outs, new_of, wrt, window = nest
    n_state = len(st_vars)
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}{CTYPE[v.dtype]} ct{i}[{k}], cur{i}[{k}];")
        lines.append(f"{ind}VK_WINDOW({CTYPE[v.dtype]}, buf{i}, {window * k});")
    for i, v in enumerate(st_vars):
        lines.append(f"{ind}VK_WINDOW_ALLOC({CTYPE[v.dtype]}, buf{i}, {window * _size(v)});")
        k = _size(v)
        lines.append(f"{ind}for (int64_t c = 0; c < {k}; c++) ct{i}[c] = seed{i}[s * {k} + c];")
    for j, v in enumerate(outs):
        lines.append(f"{ind}{CTYPE[v.dtype]} nx{j}[{_size(v)}];")
        if j not in new_of.values():
            lines.append(f"{ind}{CTYPE[v.dtype]} zo{j}[{_size(v)}] = {{0}};")
    for k, w_pos in enumerate(wrt):
        v = ins[w_pos]
        lines.append(f"{ind}{CTYPE[v.dtype]} g{k}[{_size(v)}];")
        if w_pos >= n_state:
            lines.append(f"{ind}{CTYPE[v.dtype]} acc{k}[{_size(v)}] = {{0}};")
    _decl_temps(fwd_low, lines, ind)
    _decl_temps(bwd_low, lines, ind)
    lines.append(f"{ind}int64_t T = steps[s];")
    lines.append(f"{ind}for (int64_t w = T > 0 ? ((T - 1) / {window}) * {window} : -1; w >= 0; "
                 f"w -= {window}) {{")
    lines.append(f"{ind}    int64_t end = w + {window} < T ? w + {window} : T;")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}    for (int64_t c = 0; c < {k}; c++) "
                     f"cur{i}[c] = ck{i}[((w / {window}) * n + s) * {k} + c];")
    lines.append(f"{ind}    for (int64_t t = w; t < end; t++) {{")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}        for (int64_t c = 0; c < {k}; c++) buf{i}[(t - w) * {k} + c] = cur{i}[c];")
    lines.append(f"{ind}        if (t == end - 1) break;")
    lines.append(ind + "        " + _POLL)
    emit(fwd_body, lines, ind + "        ")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}        for (int64_t c = 0; c < {k}; c++) cur{i}[c] = nx{new_of[i]}[c];")
    lines.append(f"{ind}    }}")
    lines.append(f"{ind}    for (int64_t t = end - 1; t >= w; t--) {{")
    lines.append(ind + "        " + _POLL)
    emit(bwd_body, lines, ind + "        ")
    for k, w_pos in enumerate(wrt):
        size = _size(ins[w_pos])
        if w_pos < n_state:
            lines.append(f"{ind}        for (int64_t c = 0; c < {size}; c++) ct{w_pos}[c] = g{k}[c];")
        else:
            lines.append(f"{ind}        for (int64_t c = 0; c < {size}; c++) acc{k}[c] += g{k}[c];")
    lines.append(f"{ind}    }}")
    lines.append(f"{ind}}}")
    for k, w_pos in enumerate(wrt):
        size = _size(ins[w_pos])
        src = f"ct{w_pos}" if w_pos < n_state else f"acc{k}"
        lines.append(f"{ind}for (int64_t c = 0; c < {size}; c++) go{k}[s * {size} + c] = {src}[c];")


def _open_lanes_reverse(lines, ind, ins, st_vars, wrt, window, simd):
    """What both lane-group reverses start with: per lane its cotangents ``ct``, current state
    ``cur``, Param accumulators ``acc`` and window buffer ``buf``; each lane's last step and the
    group's longest run; then the loop over windows from the last, opened, with each lane that
    takes part in the window given its checkpoint.  ``simd``: also the vector results ``nc`` and
    ``gs``, a ``row`` per lane (a padding lane reads its group's first sample), and the state
    and window buffers zeroed, since every lane computes every step."""
    n_state = len(st_vars)
    for i, v in enumerate(st_vars):
        k = _size(v)
        extra = f", nc{i}[VK_LANES][{k}]" if simd else ""
        lines.append(f"{ind}{CTYPE[v.dtype]} ct{i}[VK_LANES][{k}], cur{i}[VK_LANES][{k}]{extra};")
        lines.append(f"{ind}VK_WINDOW({CTYPE[v.dtype]}, buf{i}, {window * k} * VK_LANES);")
    for k, w_pos in enumerate(wrt):
        v = ins[w_pos]
        if simd:
            lines.append(f"{ind}{CTYPE[v.dtype]} gs{k}[VK_LANES][{_size(v)}];")
        if w_pos >= n_state:
            lines.append(f"{ind}{CTYPE[v.dtype]} acc{k}[VK_LANES][{_size(v)}];")
    lines.append(f"{ind}int64_t last[VK_LANES], {'row[VK_LANES], ' if simd else ''}longest = 0;")
    for i, v in enumerate(st_vars):
        size = window * _size(v)
        lines.append(f"{ind}VK_WINDOW_ALLOC({CTYPE[v.dtype]}, buf{i}, {size} * VK_LANES);")
        if simd:
            lines.append(f"{ind}for (int64_t c = 0; c < {size} * VK_LANES; c++) buf{i}[c] = 0;")
    lines.append(f"{ind}for (int l = 0; l < VK_LANES; l++) {{")
    if simd:
        lines.append(f"{ind}    row[l] = s + l < n ? s + l : s;")
    lines.append(f"{ind}    last[l] = s + l < n ? steps[s + l] : 0;")
    lines.append(f"{ind}    if (last[l] > longest) longest = last[l];")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}    for (int64_t c = 0; c < {k}; c++) "
                     f"ct{i}[l][c] = s + l < n ? seed{i}[(s + l) * {k} + c] : 0;")
        if simd:
            lines.append(f"{ind}    for (int64_t c = 0; c < {k}; c++) cur{i}[l][c] = 0;")
    for k, w_pos in enumerate(wrt):
        if w_pos >= n_state:
            lines.append(f"{ind}    for (int64_t c = 0; c < {_size(ins[w_pos])}; c++) acc{k}[l][c] = 0;")
    lines.append(f"{ind}}}")
    lines.append(f"{ind}for (int64_t w = longest > 0 ? ((longest - 1) / {window}) * {window} : -1; "
                 f"w >= 0; w -= {window}) {{")
    lines.append(f"{ind}    int64_t end = w + {window} < longest ? w + {window} : longest;")
    lines.append(f"{ind}    for (int l = 0; l < VK_LANES; l++) {{")
    lines.append(f"{ind}        if (w >= last[l]) continue;")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}        for (int64_t c = 0; c < {k}; c++) "
                     f"cur{i}[l][c] = ck{i}[((w / {window}) * n + s + l) * {k} + c];")
    lines.append(f"{ind}    }}")


def _lanes_gradients_out(lines, ind, ins, n_state, wrt):
    """Each real lane's gradients (a state's cotangent, a Param's accumulated sum) written out."""
    lines.append(f"{ind}for (int l = 0; l < VK_LANES && s + l < n; l++) {{")
    for k, w_pos in enumerate(wrt):
        size = _size(ins[w_pos])
        src = f"ct{w_pos}[l]" if w_pos < n_state else f"acc{k}[l]"
        lines.append(f"{ind}    for (int64_t c = 0; c < {size}; c++) go{k}[(s + l) * {size} + c] = {src}[c];")
    lines.append(f"{ind}}}")


def _reverse_lanes(lines, ind, nest):
    """The reverse loop's body for the ``VK_LANES`` samples from ``s`` (see :data:`LANES`).  The
    lanes walk the windows together, from the last window of the longest-running sample down; a
    sample takes part in a window, a recomputed step and a reversed step exactly when it would
    alone, so each does its own operations in its own order."""
    fwd_low, fwd_body, bwd_low, bwd_body, ins, st_vars, outs, new_of, wrt, window = nest
    n_state = len(st_vars)
    _open_lanes_reverse(lines, ind, ins, st_vars, wrt, window, simd=False)
    lines.append(f"{ind}    for (int64_t t = w; t < end; t++) {{")
    lines.append(ind + "        " + _POLL)
    lines.append(f"{ind}        for (int l = 0; l < VK_LANES; l++) {{")
    li = ind + "            "
    lines.append(f"{li}int64_t lane_end = w + {window} < last[l] ? w + {window} : last[l];")
    lines.append(f"{li}if (t >= lane_end) continue;")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{li}for (int64_t c = 0; c < {k}; c++) "
                     f"buf{i}[(l * {window} + (t - w)) * {k} + c] = cur{i}[l][c];")
    lines.append(f"{li}if (t == lane_end - 1) continue;")
    for j, v in enumerate(outs):
        lines.append(f"{li}{CTYPE[v.dtype]} nx{j}[{_size(v)}];")
    _decl_temps(fwd_low, lines, li)
    emit(fwd_body, lines, li)
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{li}for (int64_t c = 0; c < {k}; c++) cur{i}[l][c] = nx{new_of[i]}[c];")
    lines.append(f"{ind}        }}")
    lines.append(f"{ind}    }}")
    lines.append(f"{ind}    for (int64_t t = end - 1; t >= w; t--) {{")
    lines.append(ind + "        " + _POLL)
    lines.append(f"{ind}        for (int l = 0; l < VK_LANES; l++) {{")
    lines.append(f"{li}if (t >= last[l]) continue;")
    for j, v in enumerate(outs):
        if j not in new_of.values():
            lines.append(f"{li}{CTYPE[v.dtype]} zo{j}[{_size(v)}] = {{0}};")
    for k, w_pos in enumerate(wrt):
        lines.append(f"{li}{CTYPE[ins[w_pos].dtype]} g{k}[{_size(ins[w_pos])}];")
    _decl_temps(bwd_low, lines, li)
    emit(bwd_body, lines, li)
    for k, w_pos in enumerate(wrt):
        size = _size(ins[w_pos])
        if w_pos < n_state:
            lines.append(f"{li}for (int64_t c = 0; c < {size}; c++) ct{w_pos}[l][c] = g{k}[c];")
        else:
            lines.append(f"{li}for (int64_t c = 0; c < {size}; c++) acc{k}[l][c] += g{k}[c];")
    lines.append(f"{ind}        }}")
    lines.append(f"{ind}    }}")
    lines.append(f"{ind}}}")
    _lanes_gradients_out(lines, ind, ins, n_state, wrt)


def _reverse_simd(lines, ind, nest):
    """The reverse loop's body for the ``VK_LANES`` samples from ``s``, the lanes stepped together
    across SIMD registers as in :func:`_forward_simd` (the recomputation of a window is the very
    same vector code as the forward's steps, so it gives the recorded states' bits).  A lane
    outside its own windows and steps computes and discards; its window buffer rows start
    zeroed, so it never reads uninitialised memory."""
    fwd_low, fwd_body, bwd_low, bwd_body, ins, st_vars, outs, new_of, wrt, window = nest
    n_state = len(st_vars)
    _open_lanes_reverse(lines, ind, ins, st_vars, wrt, window, simd=True)
    lane_end = f"(w + {window} < last[l] ? w + {window} : last[l])"
    lines.append(f"{ind}    for (int64_t t = w; t < end; t++) {{")
    lines.append(ind + "        " + _POLL)
    lines.append(f"{ind}        for (int l = 0; l < VK_LANES; l++) {{")
    lines.append(f"{ind}            if (t >= {lane_end}) continue;")
    for i, v in enumerate(st_vars):
        k = _size(v)
        lines.append(f"{ind}            for (int64_t c = 0; c < {k}; c++) "
                     f"buf{i}[((t - w) * VK_LANES + l) * {k} + c] = cur{i}[l][c];")
    lines.append(f"{ind}        }}")
    decls = [f"{CTYPE[v.dtype]} nx{j}[{_size(v)}];" for j, v in enumerate(outs)]
    results = [(f"nc{i}", f"nx{new_of[i]}", _size(v)) for i, v in enumerate(st_vars)]
    _simd_lanes_loop(lines, ind + "        ", fwd_low, fwd_body, decls, results)
    lines.append(f"{ind}        for (int l = 0; l < VK_LANES; l++) {{")
    li = ind + "            "
    lines.append(f"{li}int64_t on = t < {lane_end} - 1;")
    for i, v in enumerate(st_vars):
        _keep_if(lines, li, "on", f"cur{i}[l]", f"nc{i}[l]", _size(v))
    lines.append(f"{ind}        }}")
    lines.append(f"{ind}    }}")
    lines.append(f"{ind}    for (int64_t t = end - 1; t >= w; t--) {{")
    lines.append(ind + "        " + _POLL)
    decls = [f"{CTYPE[v.dtype]} zo{j}[{_size(v)}] = {{0}};" for j, v in enumerate(outs)
             if j not in new_of.values()]
    decls += [f"{CTYPE[ins[w_pos].dtype]} g{k}[{_size(ins[w_pos])}];" for k, w_pos in enumerate(wrt)]
    results = [(f"gs{k}", f"g{k}", _size(ins[w_pos])) for k, w_pos in enumerate(wrt)]
    _simd_lanes_loop(lines, ind + "        ", bwd_low, bwd_body, decls, results)
    lines.append(f"{ind}        for (int l = 0; l < VK_LANES; l++) {{")
    lines.append(f"{li}int64_t on = t < last[l];")
    for k, w_pos in enumerate(wrt):
        size = _size(ins[w_pos])
        if w_pos < n_state:
            _keep_if(lines, li, "on", f"ct{w_pos}[l]", f"gs{k}[l]", size)
        else:
            lines.append(_per_element(li, size, lambda c, k=k: f"acc{k}[l][{c}] = "
                                      f"on ? acc{k}[l][{c}] + gs{k}[l][{c}] : acc{k}[l][{c}];"))
    lines.append(f"{ind}        }}")
    lines.append(f"{ind}    }}")
    lines.append(f"{ind}}}")
    _lanes_gradients_out(lines, ind, ins, n_state, wrt)
