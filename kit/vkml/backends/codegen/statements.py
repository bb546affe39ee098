"""The statements a lowering produces, which every renderer prints.

A lowered program is a list of statements.  A statement is one of:

- a ``str``: one line of C, printed as it is (``t3[i1] = exp(a0[i1]);``);
- :class:`Loop`: a counted loop over one index;
- :class:`Block`: statements in a scope of their own;
- :class:`If`: one link of an ``if`` / ``else if`` / ``else`` chain;
- :class:`While`: a loop that runs while a test holds;
- :class:`Matmul` and :class:`SampleLoop`: made by the CUDA lowering only, for the kernels it
  launches in their own way (a C renderer never sees them).

The C renderer (``c_render.py``) prints them as they read below; the CUDA
renderer (``cuda_render.py``) prints the same text inside each thread, and
spreads the loops marked :attr:`Loop.parallel` over threads; the per-sample
loops (``sample_loops.py``) print them with the C renderer.
"""

from __future__ import annotations


class Loop:
    """``for (int64_t var = 0; var < extent; var++) { body }``.

    ``parallel``: every iteration is independent of the others (the CUDA
    lowering sets it), so a renderer may run them on separate threads.
    """

    __slots__ = ("var", "extent", "body", "parallel")

    def __init__(self, var, extent, body, parallel=False):
        self.var, self.extent, self.body, self.parallel = var, extent, body, parallel


class Block:
    """``{ body }``: statements in their own C scope (a reduction's accumulator is declared
    inside, so each output's loop has a fresh one)."""

    def __init__(self, body):
        self.body = body


class If:
    """One link of a branch chain: ``if (test) { body }`` when ``first``, else
    ``test { body }`` where ``test`` is the link's head (``else if (...)`` or ``else``).  The
    links of one chain are consecutive statements (a ``cond`` emits them)."""

    def __init__(self, test, body, first):
        self.test, self.body, self.first = test, body, first


class While:
    """``while (test) { body }`` (a ``while`` primitive: ``body`` recomputes the test's flag)."""

    def __init__(self, test, body):
        self.test, self.body = test, body


class Matmul:
    """A top-level matrix product (CUDA lowering only): ``loops``, the plain loop nest that
    computes it, and what the tiled kernel or cuBLAS needs to run it instead -- the buffers
    ``a``, ``b``, ``c`` and the sizes ``batch``, ``m``, ``n``, ``k`` of ``c = a @ b``."""

    def __init__(self, loops, a, b, c, batch, m, n, k, dtype):
        self.loops, self.a, self.b, self.c = loops, a, b, c
        self.batch, self.m, self.n, self.k, self.dtype = batch, m, n, k, dtype


class TreeChunks:
    """The first stage of a large float sum over contiguous rows (CUDA lowering only): ``loops``,
    the plain loop nest that computes it (one thread per chunk), and what the block-cooperative
    kernel of ``kernels_cu/tree_chunks.cuh`` needs to compute the same partials with coalesced
    reads -- the buffers ``x`` (``outs`` rows of ``total``) and ``part`` (``outs`` x ``parts``),
    the ``chunk`` (a power of two) and its ``levels`` (log2)."""

    def __init__(self, loops, x, part, outs, total, parts, chunk, dtype):
        self.loops, self.x, self.part, self.outs, self.total = loops, x, part, outs, total
        self.parts, self.chunk, self.dtype = parts, chunk, dtype
        self.levels = chunk.bit_length() - 1


class SampleLoop:
    """A top-level vmapped scan (CUDA lowering only) as a loop over samples ``var`` in
    ``[0, extent)``, each running every row of its own scan (``body``): rendered as a grid
    kernel with one thread per sample.  ``temps`` are per-sample temporaries
    ``(name, ctype, count)``, declared inside the loop (each thread its own)."""

    def __init__(self, var, extent, body, temps):
        self.var, self.extent, self.body, self.temps = var, extent, body, temps


class HelperCall(str):
    """A line of C calling a helper that reads whole buffers, ``reads`` (their names), before it
    returns (a matrix product's GEMM): a ``str`` printed as it is, whose reads the analysis of
    which results may be computed over an argument (``lower.overwritable``) counts as reads of
    every element at this line.  Every other buffer the line names (the helper's destination)
    counts as used as a whole, so no result is ever computed over it."""

    def __new__(cls, text, reads):
        line = super().__new__(cls, text)
        line.reads = frozenset(reads)
        return line


def rebuilt(s, body, test=None):
    """Statement ``s`` (a Loop, Block, If or While) with ``body`` (and, for a branch or a while
    loop, ``test``) in place of its own: what a pass rewriting the statements inside makes."""
    test = s.test if test is None and hasattr(s, "test") else test
    if isinstance(s, Loop):
        return Loop(s.var, s.extent, body, s.parallel)
    if isinstance(s, Block):
        return Block(body)
    return If(test, body, s.first) if isinstance(s, If) else While(test, body)


def leaves(line: str) -> bool:
    """Whether a line of C may jump out of the loop around it (a check's ``goto``, a ``return``,
    a ``break``): such a loop is neither split over threads nor an OpenMP SIMD loop."""
    return "goto " in line or "return" in line or "break;" in line
