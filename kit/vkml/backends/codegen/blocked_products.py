"""A product whose result only a sum of padded windows reads, computed an image at a time.

A convolution's input gradient is the product ``W^T @ dOut`` -- a gradient for every column of
the convolution, C * kh * kw rows by one column per output pixel of every image -- and then a
sum of its windows padded back to the images (``padded_sums``).  Stored whole, that product is
the size of the columns the forward pass never stores (13 MB a step for a LeNet's second layer
at batch 64): written once to memory, read back once by the sum.

Each image's windows read only that image's columns.  So the sum's loop over images computes
them itself: a GEMM call per image (its columns of the product, into a buffer of one image's
size that stays in the core's cache), then that image's passes reading the buffer.  Every
output of the product is the same sum in the same order whichever columns are computed with
it (the GEMM's contract), and the passes are the same: the same bits, with the product's
full-size array never made.  With threads, the images are split over them, each with its own
buffer and packing slot.  An image's block too big for the cache still pays: it is written and
read back once, as the whole product was, but the memory held is a thread's image, not the
batch (a 64-channel 3x3 convolution of 56x56 images at batch 8: 7 MB a block, the gradient
49.7 -> 42.8 ms on one Zen 4 core).

Found before the program is lowered (``blocked_products``): the product (2-D, by the GEMM, A
not gathered, its result read only by movements), the movements (every ``View`` rule's
``moved``) taking each window from it, and the sum those windows make.  NumPy moves an array of
element offsets as the program moves the values, which proves that every window element of
image ``b`` lies in image ``b``'s block of columns, and gives where it lies in the block -- an
affine function of the element's other indices, the same for every image.  The product and the
movements are then never lowered; the sum's passes read the buffer there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir import Var
from .lower import CTYPE
from .padded_sums import MIN_WINDOWS, disjoint, float_sums, passes_plan, windows_of
from .products import (aligned_pointer, batch_team, by_gemm, column_block, moved_offsets,
                       movements, pack_scratch, thread_pack, thread_slot)
from .statements import Block, Loop
from .threaded_nests import parallel_for

#: the fewest multiply-adds of one image's block (below it, the GEMM's packing per call costs
#: more than the stored product's memory traffic)
BLOCK_MIN_WORK = 1 << 16


@dataclass
class Blocking:
    """How a padded sum computes ``product`` an image at a time: ``width`` columns per image;
    ``pads``: the sum's windows (pad equations) in its order; ``places[k]``: where window k's
    element ``(b, *rest)`` lies in image ``b``'s block (``(constant, strides)`` over ``rest``);
    ``name``: the block's pointer in the C."""

    product: object
    pads: list
    width: int
    places: list
    name: str

    def images(self, low, env, image, body, stmts):
        """Loop ``image`` over the batch: this image's block of the product into a buffer of
        its own (a thread's, where the images are split over the program's threads), then
        ``body``, the image's passes reading it as ``self.name``; statements storing an operand
        the GEMM cannot read in place are appended to ``stmts``."""
        out = self.product.outputs[0]
        dtype = out.dtype
        batch = out.shape[1] // self.width
        team = batch_team(low, batch)
        stride = -(-out.shape[0] * self.width * dtype.itemsize // 64) * 64 // dtype.itemsize
        first = aligned_pointer(low.temp(Var((max(1, team) * stride + 64 // dtype.itemsize,),
                                             dtype)), dtype)
        if team > 1:
            at, pack = thread_slot(first, stride), thread_pack(low, dtype)
        else:
            at, pack = first, pack_scratch(low, dtype)
        call = column_block(low, self.product, env, stmts, f"{image} * {self.width}LL",
                            self.width, self.name, pack)
        loop = Loop(image, batch, [f"{CTYPE[dtype]}* {self.name} = {at};", call] + body)
        if team <= 1:            # (one thread, or a batch too small to split: one image)
            return [loop]
        return [Block(["int omp_get_thread_num(void);", parallel_for(1, team), loop])]

    def read(self, k, rest):
        """Window ``k``'s element at indices ``rest`` (past the image's) in the image's block."""
        constant, strides = self.places[k]
        terms = [f"({i})*{s}" if s != 1 else f"({i})" for i, s in zip(rest, strides) if s]
        return f"{self.name}[{' + '.join([str(constant)] + terms)}]"


def blocked_products(low, prog, outputs, uses, readers, producer):
    """``({id(top of a sum): Blocking}, values never computed)`` for the program about to be
    lowered (see the module docstring)."""
    movement = movements(low.rules, producer)
    found, skipped = {}, set()
    moved = {}
    for e in prog.eqns:
        if not (low.gemm and by_gemm(e)) or e.outputs[0].ndim != 2 or \
                low.gathered.get(id(e), (1,))[0] != 1:
            continue            # (a product gathering A is computed transposed)
        got = _blocking(low, e, outputs, uses, readers, producer, movement, moved)
        if got is not None:
            top, blocking, chain = got
            found[id(top)] = blocking
            skipped |= chain | {e.outputs[0]}
    return found, skipped


def _blocking(low, e, outputs, uses, readers, producer, movement, moved):
    """``(top, Blocking, movements)`` where product ``e`` can be computed an image at a time
    inside a padded sum, else None."""
    rules = low.rules
    product = e.outputs[0]
    if product in outputs:
        return None
    # the movements reading the product (each only read by movements or by pads)
    chain, pads, stack = set(), [], [product]
    while stack:
        u = stack.pop()
        for r in readers.get(u, ()):
            rule = rules.get(r.prim.name)
            if getattr(rule, "zero_border", False) and r.inputs[0] is u and u is not product:
                pads.append(r)
            elif movement(r.outputs[0]) is r and r.outputs[0] not in outputs:
                if r.outputs[0] not in chain:
                    chain.add(r.outputs[0])
                    stack.append(r.outputs[0])
            else:
                return None
    if len(pads) < MIN_WINDOWS or any(uses.get(p.inputs[0]) != 1 for p in pads):
        return None
    # the one sum they make, and the order it adds them in
    tops = {id(t): t for p in pads for t in readers.get(p.outputs[0], ())}
    top = _top(rules, producer, uses, readers, tops)
    if top is None or not float_sums(low, top.outputs[0]):
        return None
    windows = windows_of(top, rules, producer, lambda v: uses.get(v) == 1 and v not in outputs)
    if windows is None or sorted(map(id, windows)) != sorted(map(id, pads)) or disjoint(windows):
        return None
    out = top.outputs[0]
    plan = passes_plan(windows, out.shape)
    if plan is None or plan[0] == 0:
        return None         # (the sum's passes run inside a loop over the first axis, the images)
    images = out.shape[0]
    rows, columns = product.shape
    width = columns // images if columns % images == 0 else 0
    if width == 0 or rows * width * e.inputs[0].shape[1] < BLOCK_MIN_WORK:
        return None
    placed = []
    for p in windows:
        x = p.inputs[0]
        got = moved_offsets(x, movement, rules, moved)
        if got is None or got[0] is not product or x.shape[0] != images:
            return None
        place = _place_in_block(got[1], columns, width)
        if place is None:
            return None
        placed.append(place)
    return top, Blocking(e, windows, width, placed, low.fresh("vk_image")), chain


def _top(rules, producer, uses, readers, candidates):
    """The add ending the chain of adds that reads the pads (each add read once, by the next):
    None where the pads feed more than one such chain."""
    tops = set()
    for t in candidates.values():
        own = rules.get(t.prim.name)
        while uses.get(t.outputs[0]) == 1:
            (nxt,) = readers[t.outputs[0]]
            if rules.get(nxt.prim.name) is not own or nxt.inputs[0] is not t.outputs[0]:
                break
            t = nxt
        tops.add(t)
    return tops.pop() if len(tops) == 1 else None


def _place_in_block(offsets, columns, width):
    """``(constant, strides)``: where the element ``(b, *rest)`` of a window, at flat ``offsets``
    in the product, lies in image ``b``'s block of ``width`` columns -- the same affine function
    of ``rest`` for every ``b`` -- or None where some element lies elsewhere.  The function is
    read off image 0's first element and its neighbours along each axis, then every element is
    compared with where it puts it (one pass: the proof, at compile time)."""
    if offsets.size == 0:
        return None
    first = offsets[(0,) * offsets.ndim]

    def place(offset):
        row, column = divmod(int(offset), columns)
        return row * width + column % width if column < width else None

    constant = place(first)
    if constant is None:
        return None
    strides = []
    for axis, n in enumerate(offsets.shape[1:], 1):
        unit = [0] * offsets.ndim
        unit[axis] = 1 if n > 1 else 0
        there = place(offsets[tuple(unit)])
        if there is None:
            return None
        strides.append(there - constant if n > 1 else 0)
    rest = np.full((1,) * (offsets.ndim - 1), constant, np.int64)
    for axis, (n, s) in enumerate(zip(offsets.shape[1:], strides)):
        rest = rest + (np.arange(n, dtype=np.int64) * s).reshape((-1,) + (1,) * (len(strides) - axis - 1))
    # (an element placed before the block's start or past its end would be expected at an
    # offset no element of the product has: the comparison refuses it too)
    row, column = np.divmod(rest, width)
    image = np.arange(offsets.shape[0], dtype=np.int64).reshape((-1,) + (1,) * len(strides))
    expected = row * columns + column + image * width
    return (constant, strides) if np.array_equal(offsets, expected) else None
