"""The cpu tier's big loop nests split over threads, with the bits of one thread.

A nest the lowering marked parallel (``Loop.parallel``: an elementwise or movement store, a
reduction's per-output loops) computes each element on its own -- an element's value, and the
order of the additions of a sum, never depend on which iterations run beside it -- so running its
iterations on several threads changes no bit, whatever their number.  Only top-level nests
are split (a scan's steps run in turn), only those with at least :data:`THREAD_MIN_WORK`
iterations of their innermost statements (below it, waking the threads costs more than they
save), and never one that may leave the function early (a check's ``goto``) or calls a helper
that splits its own work (a product's GEMM).  The split nest is preceded by an OpenMP
``parallel for`` over as few of its outer parallel loops as give every thread enough
iterations (the loops inside stay whole, for the vectoriser); the program is then built with
``-fopenmp``.
"""

from __future__ import annotations

import re

from .statements import Block, HelperCall, If, Loop, While, leaves

#: the fewest innermost iterations of a nest split over threads (a 128 x 128 elementwise nest has
#: 16384 and takes a few microseconds: about what starting the threads costs)
THREAD_MIN_WORK = 1 << 15

#: the split iterations per thread the outer loops collapsed together should reach: no more of
#: them are collapsed than that takes (each further loop collapsed costs every iteration a
#: division of the shared counter, and loops left whole inside keep their vectorised, unit
#: stride form: a pooling's (64, 32, 12, 2, 12, 2) nest collapsed down to its pairs ran 3x slower
#: on two threads than on one)
SPLIT_ITERATIONS_PER_THREAD = 16

#: what marks a program whose nests are split over threads (it needs ``-fopenmp``)
THREADED_MARKER = "#pragma omp parallel for"


def threaded(stmts, threads):
    """``stmts`` (a program's top-level statements) with each big parallel nest wrapped in a
    block whose OpenMP pragma splits its outer loops over ``threads`` threads; as they are for
    one thread."""
    if threads <= 1:
        return stmts
    out = []
    for s in stmts:
        split, team = _collapsed(s, threads) if isinstance(s, Loop) and s.parallel else (0, 1)
        if split:
            out.append(Block([parallel_for(split, team), s]))
        else:
            out.append(s)
    return out


def parallel_for(loops, team) -> str:
    """The pragma splitting the ``loops`` outer loops of the nest after it over ``team`` threads
    (in equal runs of iterations)."""
    return f"{THREADED_MARKER} collapse({loops}) num_threads({team}) schedule(static)"


_COLLAPSE = re.compile(rf"^{re.escape(THREADED_MARKER)} collapse\((\d+)\)")


def collapsed_by(line: str) -> int:
    """The loops a line of :func:`parallel_for` collapses into one (0 for any other line): no
    other pragma may come between them."""
    found = _COLLAPSE.match(line)
    return int(found.group(1)) if found else 0


def _collapsed(nest, threads):
    """``(loops, team)``: how many outer loops of ``nest`` to split, over how many of at most
    ``threads`` threads -- each with at least half of :data:`THREAD_MIN_WORK` and two of the
    split iterations (on a machine of many cores a middling nest wakes a few, not all); ``(0,
    1)``: none."""
    loops = []
    loop = nest
    while isinstance(loop, Loop) and loop.parallel and isinstance(loop.extent, int):
        loops.append(loop)
        loop = loop.body[0] if len(loop.body) == 1 else None
    work = _work(nest)
    if not loops or not _may_split(nest) or work < THREAD_MIN_WORK:
        return 0, 1
    innermost = loops[-1]
    depth = len(loops)
    if depth > 1 and all(isinstance(line, str) for line in innermost.body):
        depth -= 1                    # (the elementwise innermost loop stays whole: SIMD)
    iterations, split = 1, 0
    for loop in loops[:depth]:
        if iterations >= SPLIT_ITERATIONS_PER_THREAD * threads:
            break
        iterations *= loop.extent
        split += 1
    team = min(threads, work // (THREAD_MIN_WORK // 2), iterations // 2)
    return (split, team) if team >= 2 else (0, 1)


def _work(s) -> int:
    """Innermost statements ``s`` runs (a loop: its extent times its body's)."""
    if isinstance(s, str):
        return 1
    if isinstance(s, Loop):
        return (s.extent if isinstance(s.extent, int) else 1) * max(1, sum(map(_work, s.body)))
    if isinstance(s, (Block, If, While)):
        return max(1, sum(map(_work, s.body)))
    return 1


def _may_split(s) -> bool:
    """Whether ``s`` never leaves the function early nor calls a helper with threads of its own."""
    if isinstance(s, HelperCall):
        return False
    if isinstance(s, str):
        return not leaves(s)
    if isinstance(s, (Loop, Block, If, While)):
        return all(_may_split(b) for b in s.body) and _may_split(getattr(s, "test", ""))
    return False
