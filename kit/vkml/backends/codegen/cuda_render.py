"""The CUDA C renderer: the one lowering (``lower.py``) printed as CUDA kernels and a launch plan.

The statements come from the same :class:`~.lower.Lowering` the CPU tier
uses; :class:`CudaLowering` only *annotates* them: it marks which loops are
independent per element (``Loop.parallel``), splits large reductions in two
stages, and tags top-level matrix products so they can run tiled (or on
cuBLAS).  It never changes what a statement computes.  The renderer then
turns the top-level statement list of a program into kernels, in order, all
launched on one stream:

- **grid kernels** -- a top-level loop nest whose outer loops are marked
  parallel (an elementwise or movement store, a copy, the per-output loops
  of a reduction, argmax, gather or matmul) becomes one ``__global__``
  kernel with a grid-stride loop over the flattened parallel iteration
  space; whatever is inside (a reduction's accumulation loop) runs
  sequentially in each thread.  Fused elementwise chains are one store, so
  one kernel.
- **block kernels** -- a run of sequential top-level statements (a scan's
  row loop, a while loop, a cond, a scatter-add, a scalar store) becomes one
  kernel run by ONE thread block.  Control flow is executed by every thread
  of the block alike; each parallel-marked nest inside it (a scan step's
  elementwise work, say) is spread over the block's threads
  (``COOP_THREADS``) with ``__syncthreads()`` after it; statements with no
  parallel loop run on thread 0.  A block kernel with no parallel nest
  inside is launched with one thread.  Small temporaries used by one block
  kernel only (a scan's scalar carry) live in shared memory or registers.
- **matmul kernels** -- a top-level matrix product of two buffers runs
  through the tiled kernel of ``kernels_cu/matmul.cuh`` (same summation
  order as the loops, so the same bits), or through cuBLAS when the
  backend finds it (see ``cuda.py``).  A deterministic product
  (``order="tree"``) never does: it is a grid kernel, one thread per
  output summing over k with the canonical tree.
- **per-sample scan kernels** -- a top-level scan whose step is a vmapped
  program (``vmap_of``, set by ``transforms/vmap.py``: its samples never
  interact) is a grid kernel with one thread per sample, each looping over
  all the rows of its own scan with its carry in registers (the scheme of
  GPU codes that give each simulated sample its own thread), instead of one
  block stepping every sample together.

What is NOT parallel yet (correct, but on one block or one thread): a
scan's rows and a while loop's iterations (inherently sequential; their
per-step work is block-parallel), scatter-add (duplicate indices would race;
atomics would make float sums order-dependent, so it runs on one thread in
index order, as on the CPU), argsort, solve, slogdet and cholesky (one
thread), top-level conds, and reductions whose outputs are many and short
(one thread per output).  A scatter-add, argsort, solve, slogdet or cholesky
of more than :data:`SERIAL_LIMIT` elements sends its program to the host
(the backend's NumPy fallback): one GPU thread would be far slower.

Large float sums (``SPLIT_MIN_ELEMENTS`` reduced elements or more) run in
two stages sized to fill every multiprocessor (about ``SPLIT_THREADS``
first-stage threads): when each output's elements are contiguous, the first
stage is a block per chunk whose threads read neighbouring pairs
(``kernels_cu/tree_chunks.cuh``); otherwise a thread per (chunk, output),
outputs innermost so that a warp reads neighbouring memory.  A scan that is not vmapped
is not split into per-sample kernels: that needs a proof that samples do
not interact, which only vmap carries.  Simulations carry it too (a
per-sample step kernel): their loops run one GPU thread per sample, every
step of it in the thread, from ``sample_loops.py`` with ``target="cuda"``
(``backends/cuda_loops.py`` launches them).

Every kernel has the signature ``(void* const* vk_bufs, unsigned long long*
vk_status)``: ``vk_bufs`` is a device table of the program's buffers
(inputs, outputs, temporaries, in :attr:`CudaPlan.buffers` order), so every
launch has the same two arguments and a captured CUDA graph needs no
parameter updates; ``vk_status`` holds the first failure (see
``kernels_cu/prelude.cuh``), then one word per warning check of the program
(``vkml.ops.checks``), set when it fired.

Floating point: compile with :data:`NVCC_FLAGS` (``-fmad=false``, IEEE
division and square root, no flush-to-zero): +, -, *, / and sqrt give the
bits of the CPU tier; exp/log/sin/cos/tanh/pow come from CUDA's libdevice
and agree with NumPy within a few ulps.  Float sums add in the canonical
tree order (``vkml.ops.treesum``) as on NumPy and the CPU tier, so they
give the same bits: a thread's partial is the tree over an aligned chunk of
``2^c`` reduced elements (a subtree), and the partials are summed with the
same tree; a deterministic matmul is one thread per output with the tree
over k (never the tiled kernel or cuBLAS).  Split maximum reductions need
no order.  ``cumsum`` adds each row in index order (one thread per row), as
NumPy does.

Verified without a GPU (``tests/test_cuda_codegen.py``): every kernel
generated for a broad set of the test suite's programs compiles with
``nvcc --ptx``, and the same source, compiled for the host with an
emulation header (blocks in sequence, a block's threads as POSIX threads
with a barrier for ``__syncthreads``), gives the NumPy backend's results.
Running on a GPU awaits a machine with one (``scripts/device-check``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ...ir import Program
from .c_render import template
from .lower import CTYPE, Lowering, Unsupported, linear_index, mark_parallel as _mark
from .rules import C_RULES, Statement
from .statements import Block, If, Loop, Matmul, SampleLoop, TreeChunks, While

#: threads of a block kernel that has parallel nests inside (one block)
COOP_THREADS = 256
#: threads per block of a grid kernel
GRID_THREADS = 256
#: temporaries of at most this many elements used by one block kernel only live inside it
LOCAL_LIMIT = 64
#: at most this many bytes of such temporaries in shared memory per kernel
SHARED_LIMIT = 32 * 1024
#: reductions of at least this many elements per output, and ...
SPLIT_MIN_ELEMENTS = 2048
#: ... at most this many outputs, run in two stages (partials in parallel, then their sum)
SPLIT_MAX_OUTPUTS = 4096
#: scatter_add, argsort, solve, slogdet and cholesky with more elements than this run on the host
SERIAL_LIMIT = 1 << 16
#: a split float sum's first stage aims at about this many threads (every multiprocessor busy)
SPLIT_THREADS = 1 << 17
#: elements one pass of the block-cooperative first stage reads (kernels_cu/tree_chunks.cuh:
#: two per thread)
CHUNK_SPAN = 512
#: threads per block of that kernel (VK_CHUNK_THREADS)
CHUNK_THREADS = 256
#: the tiled matmul's tile (kernels_cu/matmul.cuh)
TILE = 16
#: status words of a failure (code, three detail words; ``kernels_cu/prelude.cuh``)
STATUS_WORDS = 4

#: nvcc options for generated code: no FMA contraction, IEEE division and sqrt, no flush-to-zero
NVCC_FLAGS = ["-fmad=false", "-prec-div=true", "-prec-sqrt=true", "-ftz=false"]


# -- annotating the lowering ----------------------------------------------------------------------

class CudaLowering(Lowering):
    """The shared lowering, with loops marked parallel where each element is independent.

    Its table is :data:`CUDA_RULES`: the C rules, with the methods below for
    the primitives whose loops it marks.  Only primitives known here are
    marked: a rule added later runs correctly (sequentially, in a block
    kernel) until it is marked too.  A top-level scan whose step is a
    vmapped program (``vmap_of``: its rows never interact) becomes a
    :class:`~.statements.SampleLoop`: one thread per sample, looping over the
    rows with its carry in registers (a thread per simulated sample),
    instead of one block stepping all samples together.
    """

    def __init__(self):
        super().__init__()
        self.rules = CUDA_RULES
        self.inside = 0           # > 0 while lowering the body of a loop or a branch
        self.checks = True        # failed checks report through the status words

    def warning_flag(self, slot):
        """A warning check that fired sets its own status word, after the four of a failure."""
        return f"vk_status[{STATUS_WORDS + slot}] = 1ULL;"

    def _nested(self, lower, *args):
        self.inside += 1
        try:
            return lower(*args)
        finally:
            self.inside -= 1

    def _lower_while(self, e, env, targets):
        return self._nested(super()._lower_while, e, env, targets)

    def _lower_cond(self, e, env, targets):
        return self._nested(super()._lower_cond, e, env, targets)

    def _lower_scan(self, e, env, targets):
        origin = getattr(e.params["program"], "vmap_of", None)
        if self.inside == 0 and origin is not None:      # a top-level statement (calls inline)
            mark, counter = len(self.temps), self.counter
            try:
                return [self._nested(self._sample_scan, e, env, targets, *origin)]
            except Unsupported:
                del self.temps[mark:]
                self.counter = counter
        return self._nested(super()._lower_scan, e, env, targets)

    def _sample_scan(self, e, env, targets, step, batched, size):
        """Sample ``b`` of the batched scan: its slices of the batched operands (consts and carries
        ``(B, ...)``, xs and ys ``(rows, B, ...)``) and the whole unbatched ones, stepped through
        every row by the per-sample ``step``."""
        p = e.params
        nc, nk, length, reverse = p["num_consts"], p["num_carry"], p["length"], p["reverse"]
        if not all(batched[nc:nc + nk]):
            raise Unsupported("an unbatched carry")
        mark = len(self.temps)
        b = self.fresh("sample")
        r = self.fresh("row")
        row = f"({length - 1} - {r})" if reverse else r
        ins = [env.pointer(v) for v in e.inputs]
        sizes = [max(1, v.size) for v in step.inputs]
        consts = [f"({ptr} + {b}*{k})" if f else ptr
                  for ptr, k, f in zip(ins[:nc], sizes[:nc], batched[:nc])]
        xs = [f"({ptr} + (({row})*{size} + {b})*{k})" if f else f"({ptr} + ({row})*{k})"
              for ptr, k, f in zip(ins[nc + nk:], sizes[nc + nk:], batched[nc + nk:])]
        ys = [f"({ptr} + (({row})*{size} + {b})*{max(1, v.size)})"
              for ptr, v in zip(targets[nk:], step.outputs[nk:])]
        carry = [self.temp(v) for v in step.inputs[nc:nc + nk]]
        new = [self.temp(v) for v in step.outputs[:nk]]
        body = []
        for v, ptr, local in zip(step.inputs[nc:nc + nk], ins[nc:nc + nk], carry):
            body += self._slice_copy(v, f"({ptr} + {b}*{max(1, v.size)})", local)
        rows = self.program(step, consts + carry + xs, new + ys)
        for v, src, dst in zip(step.outputs[:nk], new, carry):
            rows += self._slice_copy(v, src, dst)
        body.append(Loop(r, length, rows))
        for v, local, ptr in zip(step.inputs[nc:nc + nk], carry, targets[:nk]):
            body += self._slice_copy(v, local, f"({ptr} + {b}*{max(1, v.size)})")
        temps = self.temps[mark:]
        del self.temps[mark:]
        if any(count > LOCAL_LIMIT for _, _, count in temps):
            raise Unsupported("a per-sample temporary too large for a thread")
        return SampleLoop(b, size, body, temps)

    def _slice_copy(self, var, src, dst):
        """A plain element-by-element copy (unmarked: it runs inside one sample's thread)."""
        i = self.fresh("c")
        return [Loop(i, max(1, var.size), [f"{dst}[{i}] = {src}[{i}];"])]

    def copy(self, var, src, dst):
        return _mark(super().copy(var, src, dst), 1)

    def _lower_argmax(self, e, env, targets):
        return _mark(super()._lower_argmax(e, env, targets), e.outputs[0].ndim)

    def _lower_gather(self, e, env, targets, hoist=None):
        """Every element independent (each checks its own index row), unless the picked slices
        are empty: then each index row is checked on its own, as NumPy checks it."""
        out, idx = e.outputs[0], e.inputs[1]
        empty_slices = any(d == 0 for d in out.shape[idx.ndim - 1:])
        return _mark(super()._lower_gather(e, env, targets, hoist=empty_slices), out.ndim)

    # scatter_add: its copy is a store (marked); the accumulation stays sequential (see module doc)

    # -- the NumPy namespace's primitives: each row of a cumsum is independent (one thread per row);
    # argsort's rows share one scratch buffer and solve/slogdet/cholesky run each matrix in turn, so
    # those stay sequential, on one thread of a block kernel
    def _lower_cumsum(self, e, env, targets):
        return _mark(super()._lower_cumsum(e, env, targets), e.outputs[0].ndim - 1)

    def _serial(self, e, env, targets):
        """scatter_add, argsort, solve, slogdet, cholesky: one thread of a block kernel does them
        (in index order, the CPU's), which is fine for small ones; above :data:`SERIAL_LIMIT`
        elements the program runs on the host instead (the backend's NumPy fallback, counted in
        ``fallbacks``): a host core beats one GPU thread by far."""
        work = max([v.size for v in e.inputs] + [v.size for v in e.outputs])
        if work > SERIAL_LIMIT:
            raise Unsupported(f"{e.prim.name} of {work} elements on one GPU thread: runs on the "
                              "host")
        return C_RULES[e.prim.name].lower(self, e, env, targets)

    def _lower_matmul(self, e, env, targets):
        out = e.outputs[0]
        loops = _mark(super()._lower_matmul(e, env, targets), out.ndim)
        if e.params.get("order") == "tree":
            return loops        # the deterministic product: one thread per output, the tree over k
        a, b = e.inputs
        try:
            pa, pb = env.pointer(a), env.pointer(b)
        except Unsupported:
            return loops
        batch = math.prod(out.shape[:-2])
        return [Matmul(loops, pa, pb, targets[0], batch, a.shape[-2], b.shape[-1], a.shape[-1],
                       out.dtype)]

    def _reduce(self, e, env, target, step, init, first=None):
        x, out = e.inputs[0], e.outputs[0]
        axes = e.params["axes"]
        total = math.prod(x.shape[a] for a in axes)
        if total >= SPLIT_MIN_ELEMENTS and 0 < out.size <= SPLIT_MAX_OUTPUTS:
            return self._split_reduce(e, env, target, step, init, first, total)
        return super()._reduce(e, env, target, step, init, first)      # (marked there)

    def _tree_reduce(self, e, env, target):
        x, out = e.inputs[0], e.outputs[0]
        total = math.prod(x.shape[a] for a in e.params["axes"])
        if total >= SPLIT_MIN_ELEMENTS and 0 < out.size <= SPLIT_MAX_OUTPUTS:
            return self._split_tree_reduce(e, env, target, total)
        return super()._tree_reduce(e, env, target)                    # (marked there)

    def _split_tree_reduce(self, e, env, target, total):
        """A float sum in two stages with the canonical tree's bits: each partial is the tree over
        one aligned chunk of ``2^c`` consecutive reduced elements (exactly a subtree, the last one
        padded), computed in parallel; then each output sums its partials with the tree.  A
        chunk is never wider than the padded total, so no zero subtree is added above the root.

        Enough partials to fill every multiprocessor (about :data:`SPLIT_THREADS` threads), laid
        out so that neighbouring threads read neighbouring memory: when each output's elements
        are contiguous (the reduced axes are the last ones) the first stage is the
        block-cooperative kernel of ``kernels_cu/tree_chunks.cuh`` (a block per chunk, a thread
        per pair of elements); otherwise a thread per (chunk, output) with the outputs innermost,
        so a warp reads neighbouring outputs' elements."""
        x, out = e.inputs[0], e.outputs[0]
        axes = sorted(e.params["axes"])
        padded = 1 << (total - 1).bit_length()
        t = CTYPE[out.dtype]
        contiguous = axes == list(range(x.ndim - len(axes), x.ndim))
        try:
            source = env.pointer(x) if contiguous else None
        except Unsupported:
            source = None
        if source is not None:      # a block per chunk: at least one span of its threads' pairs
            want = max(CHUNK_SPAN, -(-total * max(1, out.size) * CHUNK_THREADS // SPLIT_THREADS))
        else:                       # a thread per chunk
            want = max(32, -(-total * max(1, out.size) // SPLIT_THREADS))
        chunk = min(padded, 1 << (want - 1).bit_length())
        parts = -(-total // chunk)
        part = self.fresh("t")
        self.temps.append((part, t, max(1, out.size * parts)))
        oidx, _, full = self._reduce_indices(x, axes)
        c, q, rr = self.fresh("p"), self.fresh("q"), self.fresh("r")
        stride = 1
        for a in reversed(axes):
            full[a] = f"(({rr}) / {stride}) % {x.shape[a]}" if stride > 1 else f"({rr}) % {x.shape[a]}"
            stride *= x.shape[a]
        decl, st = self.tree_stack(out.dtype, chunk)
        # partials output-major ([outputs, parts]) for the contiguous kernel, chunk-major else
        def layout(outputs, chunk_index):
            return outputs + [chunk_index] if source is not None else [chunk_index] + outputs
        order, pshape = layout(oidx, c), tuple(layout(list(out.shape), parts))
        valid = f"({total} - {c} * (int64_t){chunk} < {chunk} ? {total} - {c} * (int64_t){chunk} : {chunk})"
        body = [f"const int64_t {rr} = {c} * (int64_t){chunk} + {q};", f"if ({rr} >= {total}) break;",
                f"vk_tree_push_{t}({st}, {q}, 0, {env.read(x, full)});"]
        stage1 = [Block(decl + [Loop(q, chunk, body),
                                 f"{part}[{linear_index(order, pshape)}] = "
                                 f"vk_tree_fold_{t}({st}, {valid}, {chunk.bit_length() - 1});"])]
        for v, extent in reversed(list(zip(order, pshape))):
            stage1 = [Loop(v, extent, stage1)]
        _mark(stage1, len(pshape))
        if source is not None:
            stage1 = [TreeChunks(stage1, source, part, max(1, out.size), total, parts, chunk,
                                 out.dtype)]
        oidx2 = [self.fresh("i") for _ in oidx]
        c2 = self.fresh("p")
        order2 = layout(oidx2, c2)
        decl2, st2 = self.tree_stack(out.dtype, parts)
        stage2 = [Block(decl2 + [Loop(c2, parts, [f"vk_tree_push_{t}({st2}, {c2}, 0, "
                                                   f"{part}[{linear_index(order2, pshape)}]);"]),
                                  f"{target}[{linear_index(oidx2, out.shape)}] = "
                                  f"{self.tree_fold(out.dtype, st2, parts)};"])]
        for v, extent in reversed(list(zip(oidx2, out.shape))):
            stage2 = [Loop(v, extent, stage2)]
        _mark(stage2, out.ndim)
        return stage1 + stage2

    def _split_reduce(self, e, env, target, step, init, first, total):
        """A maximum (or an integer sum) in two stages: ``parts`` partial results per output, each
        over an interleaved slice (coalesced reads), computed in parallel; then each output
        combines its partials in order.  Exact in any order (float sums use
        :meth:`_split_tree_reduce`)."""
        x, out = e.inputs[0], e.outputs[0]
        axes = e.params["axes"]
        kept = [i for i in range(x.ndim) if i not in axes]
        parts = max(1, min(8192, -(-total // 32)))
        acc_t = CTYPE[out.dtype]
        part = self.fresh("t")
        self.temps.append((part, acc_t, max(1, out.size * parts)))
        oidx = [self.fresh("i") for _ in kept]
        c, q, rr = self.fresh("p"), self.fresh("q"), self.fresh("r")
        full = [None] * x.ndim
        for i, v in zip(kept, oidx):
            full[i] = v
        stride = 1
        for a in reversed(axes):
            full[a] = f"(({rr}) / {stride}) % {x.shape[a]}" if stride > 1 else f"({rr}) % {x.shape[a]}"
            stride *= x.shape[a]
        val = env.read(x, full)
        per = -(-total // parts)
        body = [f"const int64_t {rr} = {c} + ({q})*{parts};", f"if ({rr} >= {total}) break;"]
        if first is not None:
            body.append(f"if ({q} == 0) {{ {first.format(x=val)} }} else {{ {step.format(x=val)} }}")
        else:
            body.append(step.format(x=val))
        pshape = tuple(out.shape) + (parts,)
        stage1 = [Block([f"{acc_t} acc = {init if init is not None else 0};", Loop(q, per, body),
                         f"{part}[{linear_index(oidx + [c], pshape)}] = acc;"])]
        for v, extent in reversed(list(zip(oidx + [c], pshape))):
            stage1 = [Loop(v, extent, stage1)]
        _mark(stage1, len(pshape))
        oidx2 = [self.fresh("i") for _ in kept]
        c2 = self.fresh("p")
        pval = f"{part}[{linear_index(oidx2 + [c2], pshape)}]"
        inner = [f"if ({c2} == 0) {{ {first.format(x=pval)} }} else {{ {step.format(x=pval)} }}"
                 if first is not None else step.format(x=pval)]
        stage2 = [Block([f"{acc_t} acc = {init if init is not None else 0};", Loop(c2, parts, inner),
                         f"{target}[{linear_index(oidx2, out.shape)}] = acc;"])]
        for v, extent in reversed(list(zip(oidx2, out.shape))):
            stage2 = [Loop(v, extent, stage2)]
        _mark(stage2, out.ndim)
        return stage1 + stage2


#: the C rules, and what differs on CUDA: loops marked parallel where each element is
#: independent, the bodies of loops and branches counted (``inside``), a top-level vmapped scan
#: as one thread per sample, a top-level matrix product tagged for the tiled kernel.  (Stores,
#: copies and reductions -- split in two stages when large -- differ through the methods of
#: :class:`CudaLowering` the C rules call.)
CUDA_RULES = C_RULES | {
    "argmax": Statement(CudaLowering._lower_argmax),
    "gather": Statement(CudaLowering._lower_gather),
    "cumsum": Statement(CudaLowering._lower_cumsum),
    "matmul": Statement(CudaLowering._lower_matmul),
    "scan": Statement(CudaLowering._lower_scan),
    "while": Statement(CudaLowering._lower_while),
    "cond": Statement(CudaLowering._lower_cond),
} | {name: Statement(CudaLowering._serial)
     for name in ("scatter_add", "argsort", "solve", "slogdet", "cholesky")}


# -- the plan ---------------------------------------------------------------------------------------

@dataclass
class KernelSpec:
    """One launch of a plan.

    ``kind`` is ``"grid"`` (grid-stride over ``total`` elements), ``"block"``
    (one block of ``threads``), ``"chunks"`` (blocks striding over ``total`` chunks of a
    large sum, ``kernels_cu/tree_chunks.cuh``) or ``"matmul"`` (the tiled kernel; ``gemm`` is
    ``(a, b, c, batch, m, n, k, dtype)`` with buffer indices when cuBLAS may
    replace it, else None).
    """

    name: str
    kind: str
    total: int = 0
    threads: int = 1
    gemm: tuple | None = None
    dims: tuple = ()

    def launch(self, sm_count=132):
        """``(grid, block)`` for this kernel."""
        if self.kind == "grid":
            blocks = max(1, min(-(-self.total // GRID_THREADS), sm_count * 32))
            return (blocks, 1, 1), (GRID_THREADS, 1, 1)
        if self.kind == "chunks":
            blocks = max(1, min(self.total, sm_count * 16))
            return (blocks, 1, 1), (CHUNK_THREADS, 1, 1)
        if self.kind == "matmul":
            batch, m, n = self.dims
            return (max(1, -(-n // TILE)), max(1, -(-m // TILE)), max(1, min(batch, 65535))), \
                (TILE, TILE, 1)
        return (1, 1, 1), (self.threads, 1, 1)


@dataclass
class CudaPlan:
    """A program as CUDA source and the launches that run it.

    ``buffers``: ``(name, ctype, count)`` for every entry of the device
    buffer table -- the program's inputs (``a0``...), outputs (``o0``...),
    then the temporaries that outlive a kernel; ``errors``: primitive names
    by error code - 1, as the CPU tier reports them; ``messages``: error code
    -> the message of a failed check; ``warnings``: the messages of warning
    checks, each with a status word after the first :data:`STATUS_WORDS`
    (set when it fired: one warning per run).
    """

    body: str
    kernels: list
    buffers: list
    n_in: int
    n_out: int
    errors: list
    uses_matmul: bool = False
    statics: list = field(default_factory=list)
    messages: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    @property
    def status_words(self) -> int:
        """How many 64-bit status words a run needs: a failure's four, then one per warning."""
        return STATUS_WORDS + len(self.warnings)

    @property
    def source(self) -> str:
        """The whole module: prelude, templates it uses, then the program's kernels."""
        return module_source([self])


def prelude() -> str:
    """What every generated CUDA module starts with: the CUDA prelude, then the shared scalar
    helpers (the per-sample loops of ``sample_loops.py`` start with it too)."""
    return template("prelude.cuh") + "\n" + template("helpers.h")


def module_source(plans, namespaces=False) -> str:
    """One translation unit for ``plans`` (the backend compiles one plan per module; the codegen
    test compiles many at once, each in a namespace of its own)."""
    parts = [prelude()]
    if any(p.uses_matmul for p in plans):
        parts.append(template("matmul.cuh"))
    if any("vk_tree_chunks<" in p.body for p in plans):
        parts.append(template("tree_chunks.cuh"))
    for i, p in enumerate(plans):
        parts.append(f"namespace vkp{i} {{\n{p.body}}}\n" if namespaces else p.body)
    return "\n".join(parts)


def cuda_plan(program: Program, prefix="vk_") -> CudaPlan:
    """The CUDA plan of ``program`` (raises :class:`~.lower.Unsupported` for what the lowering
    cannot compile; the backend runs those on NumPy)."""
    low = CudaLowering()
    ins = [f"a{i}" for i in range(len(program.inputs))]
    outs = [f"o{i}" for i in range(len(program.outputs))]
    stmts = low.program(program, ins, outs)
    table = [(n, CTYPE[v.dtype], max(1, v.size)) for n, v in zip(ins, program.inputs)]
    table += [(n, CTYPE[v.dtype], max(1, v.size)) for n, v in zip(outs, program.outputs)]
    return _Renderer(low, stmts, table, prefix).plan(len(ins), len(outs))


# -- rendering ------------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_]\w*")
#: a barrier after which every thread stops if the submission failed: the status is read between
#: two barriers, so no thread can report a failure of the next phase before all have read it (with
#: one barrier, a fast thread 0 failing right after it let the others return while it waited at the
#: next barrier for them: a hang)
_SYNC = ("{ __syncthreads(); const bool vk_stop = vk_failed(vk_status); __syncthreads(); "
         "if (vk_stop) return; }")


def _has_par(s) -> bool:
    if isinstance(s, Loop):
        return s.parallel or any(_has_par(b) for b in s.body)
    if isinstance(s, (Matmul, TreeChunks)):
        return True
    if isinstance(s, (Block, While)):
        return any(_has_par(b) for b in s.body)
    if isinstance(s, _Chain):
        return any(_has_par(b) for i in s.ifs for b in i.body)
    return False


class _Chain:
    """An if / else if / else chain (the lowering emits its links as consecutive statements)."""

    def __init__(self, ifs):
        self.ifs = ifs


def _chains(stmts):
    out = []
    for s in stmts:
        if isinstance(s, If) and not s.first and out and isinstance(out[-1], _Chain):
            out[-1].ifs.append(s)
        elif isinstance(s, If):
            out.append(_Chain([s]))
        else:
            out.append(s)
    return out


def _nest(loop):
    """The parallel prefix of a marked nest: ``(vars, extents, body)``."""
    vars_, extents = [], []
    s = loop
    while True:
        vars_.append(s.var)
        extents.append(s.extent)
        if len(s.body) == 1 and isinstance(s.body[0], Loop) and s.body[0].parallel:
            s = s.body[0]
        else:
            return vars_, extents, s.body


def _decode(vars_, extents, flat, body):
    """The loop indices ``vars_`` of a nest, from its flattened index ``flat``; only those the
    ``body`` lines read are declared (nvcc warns of an unused one: a broadcast axis, say)."""
    text = "\n".join(body)
    lines, stride = [], 1
    strides = []
    # an empty nest (a zero extent) never runs its body: its decode divides by 1, not by 0
    extents_ = [max(1, e) for e in extents]
    for e in reversed(extents_):
        strides.append(stride)
        stride *= e
    strides.reverse()
    for i, (v, e, s) in enumerate(zip(vars_, extents_, strides)):
        q = flat if s == 1 else f"({flat} / {s})"
        if re.search(rf"\b{v}\b", text):
            lines.append(f"const int64_t {v} = {q if i == 0 else f'{q} % {e}'};")
    return lines, math.prod(extents)


class _Renderer:
    def __init__(self, low, stmts, table, prefix):
        self.low, self.stmts, self.prefix = low, stmts, prefix
        self.table = list(table)
        self.counter = 0
        self.uses_matmul = False

    def fresh(self, what):
        self.counter += 1
        return f"vk_{what}{self.counter}"

    # -- sequential statements (inside one thread) ------------------------------------------------
    def seq(self, stmts, lines, ind):
        for s in stmts:
            if isinstance(s, str):
                lines.append(ind + s)
            elif isinstance(s, Loop):
                lines.append(f"{ind}for (int64_t {s.var} = 0; {s.var} < {s.extent}; {s.var}++) {{")
                self.seq(s.body, lines, ind + "    ")
                lines.append(ind + "}")
            elif isinstance(s, (Matmul, TreeChunks)):
                self.seq(s.loops, lines, ind)
            elif isinstance(s, Block):
                lines.append(ind + "{")
                self.seq(s.body, lines, ind + "    ")
                lines.append(ind + "}")
            elif isinstance(s, If):
                lines.append(ind + (f"if ({s.test}) {{" if s.first else f"{s.test} {{"))
                self.seq(s.body, lines, ind + "    ")
                lines.append(ind + "}")
            elif isinstance(s, _Chain):
                self.seq(s.ifs, lines, ind)
            elif isinstance(s, While):
                lines.append(f"{ind}while ({s.test}) {{")
                self.seq(s.body, lines, ind + "    ")
                lines.append(ind + "}")
            else:
                raise TypeError(s)

    # -- one block, cooperatively ------------------------------------------------------------------
    def coop(self, stmts, lines, ind):
        """Statements run by every thread of one block: parallel nests spread over the threads,
        control flow executed alike by all, leaf statements on thread 0."""
        leaf = []
        for s in _chains(stmts):
            if _has_par(s):
                self._thread0(leaf, lines, ind)
                leaf = []
                self._coop_one(s, lines, ind)
            else:
                leaf.append(s)
        self._thread0(leaf, lines, ind)

    def _seq_exiting(self, stmts, ind):
        """``stmts`` as sequential lines whose failures jump to a fresh label (a thread must still
        reach the block's barrier): ``(lines, label, jumps)``."""
        body = []
        self.seq(stmts, body, ind)
        label = self.fresh("fail")
        text = "\n".join(body)
        if "goto done;" not in text:
            return body, label, False
        return text.replace("goto done;", f"goto {label};").split("\n"), label, True

    def _thread0(self, leaf, lines, ind):
        if not leaf:
            return
        body, label, jumps = self._seq_exiting(leaf, ind + "        ")
        lines.append(ind + "if (threadIdx.x == 0) {")
        lines.append(ind + "    {")
        lines += body
        lines.append(ind + "    }")
        if jumps:
            lines.append(f"{ind}    {label}: ;")
            lines.append(ind + "    if (err_) { vk_report(vk_status, err_, info); err_ = 0; }")
        lines.append(ind + "}")
        lines.append(ind + _SYNC)

    def _coop_one(self, s, lines, ind):
        if isinstance(s, (Matmul, TreeChunks)):
            for loop in s.loops:
                if _has_par(loop):
                    self._coop_one(loop, lines, ind)
                else:
                    self._thread0([loop], lines, ind)
            return
        if isinstance(s, Loop) and s.parallel:
            vars_, extents, body = _nest(s)
            f = self.fresh("f")
            inner, label, jumps = self._seq_exiting(body, ind + "        ")
            decode, total = _decode(vars_, extents, f, inner)
            lines.append(f"{ind}for (int64_t {f} = threadIdx.x; {f} < {total}; {f} += blockDim.x) {{")
            lines += [ind + "    " + d for d in decode]
            lines.append(ind + "    {")
            lines += inner
            lines.append(ind + "    }")
            if jumps:
                lines.append(f"{ind}    {label}: ;")
                lines.append(ind + "    if (err_) break;")
            lines.append(ind + "}")
            if jumps:
                lines.append(ind + "if (err_) { vk_report(vk_status, err_, info); err_ = 0; }")
            lines.append(ind + _SYNC)
        elif isinstance(s, Loop):
            lines.append(f"{ind}for (int64_t {s.var} = 0; {s.var} < {s.extent}; {s.var}++) {{")
            self.coop(s.body, lines, ind + "    ")
            lines.append(ind + "}")
        elif isinstance(s, Block):
            lines.append(ind + "{")
            self.coop(s.body, lines, ind + "    ")
            lines.append(ind + "}")
        elif isinstance(s, While):
            go = self.fresh("go")
            lines.append(ind + "while (1) {")
            lines.append(ind + "    __syncthreads();")
            lines.append(f"{ind}    const bool {go} = ({s.test});")
            lines.append(ind + "    __syncthreads();")
            lines.append(f"{ind}    if (!{go}) break;")
            self.coop(s.body, lines, ind + "    ")
            lines.append(ind + "}")
        elif isinstance(s, _Chain):
            b = self.fresh("branch")
            lines.append(ind + "{")
            lines.append(f"{ind}    int {b} = -1;")
            for k, i in enumerate(s.ifs):
                head = f"if ({i.test})" if i.first else i.test
                lines.append(f"{ind}    {head} {b} = {k};")
            lines.append(ind + "    __syncthreads();")
            for k, i in enumerate(s.ifs):
                lines.append(f"{ind}    {'if' if k == 0 else 'else if'} ({b} == {k}) {{")
                self.coop(i.body, lines, ind + "        ")
                lines.append(ind + "    }")
            lines.append(ind + "}")
        else:
            raise TypeError(s)

    # -- kernels -----------------------------------------------------------------------------------
    def plan(self, n_in, n_out):
        units = []          # (kind, payload)
        pending = []
        for s in self.stmts:
            par = (isinstance(s, Loop) and s.parallel) or \
                isinstance(s, (Matmul, SampleLoop, TreeChunks))
            if par:
                if pending:
                    units.append(("block", pending))
                    pending = []
                units.append(("matmul" if isinstance(s, Matmul) else
                              "sample" if isinstance(s, SampleLoop) else
                              "chunks" if isinstance(s, TreeChunks) else "grid", s))
            else:
                pending.append(s)
        if pending:
            units.append(("block", pending))

        rendered = []       # (spec, body lines)
        for kind, payload in units:
            name = f"{self.prefix}k{len(rendered)}"
            if kind == "grid":
                rendered.append(self._grid(name, payload))
            elif kind == "sample":
                rendered.append(self._sample(name, payload))
            elif kind == "matmul":
                rendered.append(self._matmul(name, payload))
            elif kind == "chunks":
                rendered.append(self._chunks(name, payload))
            else:
                rendered.append(self._block(name, payload))

        # which kernels use which temporaries: a small one used by one block kernel lives inside it
        temp_types = {n: (t, c) for n, t, c in self.low.temps}
        users = {}
        tokens = []
        for i, (spec, body) in enumerate(rendered):
            names = set(_NAME.findall("\n".join(body)))
            tokens.append(names)
            for n in names & temp_types.keys():
                users.setdefault(n, set()).add(i)
        local = {}
        shared_bytes = {}
        for n, (ctype, count) in temp_types.items():
            ks = users.get(n, set())
            if len(ks) != 1:
                continue
            (k,) = ks
            spec = rendered[k][0]
            if spec.kind != "block" or count > LOCAL_LIMIT:
                continue
            size = count * _SIZES[ctype]
            if spec.threads > 1:
                if shared_bytes.get(k, 0) + size > SHARED_LIMIT:
                    continue
                shared_bytes[k] = shared_bytes.get(k, 0) + size
            local[n] = k
        for n, ctype, count in self.low.temps:
            if n not in local and n in users:
                self.table.append((n, ctype, count))
        index = {n: (i, t) for i, (n, t, _) in enumerate(self.table)}

        out = [s.replace("static const ", "__device__ const ", 1) for s in self.low.statics]
        specs = []
        for k, ((spec, body), names) in enumerate(zip(rendered, tokens)):
            decls = []
            for n in sorted(names & index.keys(), key=lambda n: index[n][0]):
                i, t = index[n]
                decls.append(f"    {t}* {n} = ({t}*)vk_bufs[{i}];")
            for n in sorted(names & local.keys()):
                if local[n] == k:
                    t, c = temp_types[n]
                    qual = "__shared__ " if spec.threads > 1 else ""
                    decls.append(f"    {qual}{t} {n}[{c}];")
            if spec.gemm is not None:
                a, b, c = spec.gemm[:3]
                if all(x in index for x in (a, b, c)):
                    spec.gemm = (index[a][0], index[b][0], index[c][0]) + spec.gemm[3:]
                else:
                    spec.gemm = None
            out.append(f'extern "C" __global__ void {spec.name}(void* const* vk_bufs, '
                       "unsigned long long* vk_status) {")
            out.append("    if (vk_failed(vk_status)) return;")
            out += decls
            out += body
            out.append("}")
            out.append("")
            specs.append(spec)
        return CudaPlan("\n".join(out) + "\n", specs, self.table, n_in, n_out, list(self.low.errors),
                        self.uses_matmul, list(self.low.statics), dict(self.low.messages),
                        list(self.low.warnings))

    def _grid(self, name, loop):
        vars_, extents, body = _nest(loop)
        inner = []
        self.seq(body, inner, "            ")
        decode, total = _decode(vars_, extents, "vk_f", inner)
        return KernelSpec(name, "grid", total=total), _grid_stride("vk_f", total, decode, inner)

    def _sample(self, name, loop):
        """One thread per sample (grid-stride), each with its own temporaries, running its rows."""
        inner = [f"            {ctype} {tname}[{count}];" for tname, ctype, count in loop.temps]
        self.seq(loop.body, inner, "            ")
        return KernelSpec(name, "grid", total=loop.extent), \
            _grid_stride(loop.var, loop.extent, [], inner)

    def _block(self, name, stmts):
        threads = COOP_THREADS if any(_has_par(s) for s in stmts) else 1
        lines = ["    {"]
        self.coop(stmts, lines, "        ")
        lines.append("    }")
        if any("vk_report(" in line for line in lines):
            lines.insert(0, "    int err_ = 0; int* err = &err_; int64_t info[3] = {0, 0, 0};")
        return KernelSpec(name, "block", threads=threads), lines

    def _chunks(self, name, tc):
        """A large contiguous sum's first stage: the block-cooperative kernel, a block per
        chunk (``kernels_cu/tree_chunks.cuh``)."""
        return KernelSpec(name, "chunks", total=tc.outs * tc.parts), [
            f"    vk_tree_chunks<{CTYPE[tc.dtype]}>({tc.x}, {tc.part}, {tc.outs}LL, {tc.total}LL, "
            f"{tc.parts}LL, {tc.chunk}LL, {tc.levels});"]

    def _matmul(self, name, mm):
        if -(-mm.m // TILE) > 65535:
            return self._grid(name, mm.loops[0])
        self.uses_matmul = True
        t = CTYPE[mm.dtype]
        lines = [f"    vk_matmul_tiled<{t}>({mm.a}, {mm.b}, {mm.c}, {mm.batch}LL, {mm.m}LL, {mm.n}LL, "
                 f"{mm.k}LL);"]
        gemm = (mm.a, mm.b, mm.c, mm.batch, mm.m, mm.n, mm.k, mm.dtype)
        return KernelSpec(name, "matmul", gemm=gemm, dims=(mm.batch, mm.m, mm.n)), lines


def _grid_stride(var, total, decode, inner):
    """A kernel body: ``inner`` once per index ``var`` in ``[0, total)``, spread over the grid's
    threads (grid-stride); a failure (``goto done``) stops the thread and is reported."""
    jumps = "goto done;" in "\n".join(inner)
    lines = []
    if jumps:
        lines.append("    int err_ = 0; int* err = &err_; int64_t info[3] = {0, 0, 0};")
    lines.append("    {")
    lines.append(f"    for (int64_t {var} = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; "
                 f"{var} < {total}; {var} += (int64_t)blockDim.x * gridDim.x) {{")
    lines += ["        " + d for d in decode]
    lines.append("        {")
    lines += inner
    lines.append("        }")
    lines.append("    }")
    lines.append("    }")
    if jumps:
        lines.append("    return;")
        lines.append("done:")
        lines.append("    vk_report(vk_status, err_, info);")
    return lines


_SIZES = {"double": 8, "float": 4, "int32_t": 4, "int64_t": 8, "uint8_t": 1}


# -- the canonical-tree sum (kernels_cu/tree_sum.cu) ----------------------------------------------

#: samples one block of the tree-sum kernel sums (a power of two)
TREE_CHUNK = 1024


def tree_sum_levels(n: int):
    """The launches of ``kernels_cu/tree_sum.cu`` that sum ``n >= 1`` samples: one
    ``(valid, chunks, chunk)`` per level -- ``valid`` rows are read (the rest are the zero padding),
    ``chunks`` partials of ``chunk`` rows each are written; the next level sums those partials.
    Each chunk is an aligned subtree of the canonical tree, so the bits are ``tree_sum``'s."""
    if n < 1:
        raise ValueError("tree_sum_levels needs at least one sample")
    width = 1 << (n - 1).bit_length()
    levels, valid = [], n
    while True:
        chunk = min(TREE_CHUNK, width)
        chunks = width // chunk
        levels.append((valid, chunks, chunk))
        if chunks == 1:
            return levels
        valid = width = chunks
