"""Elementwise loop nests in SIMD registers, their libm calls in glibc's vector versions (libmvec).

Why: a graph kernel's launch and reverse are batched programs over every
sample, and the loop nest that computes ``sin(k * u)`` for 10^3 samples
spent most of its time in glibc's scalar ``sin``; libmvec's vector ``sin``
computes 4 or 8 of them at once.

The catch is that a sample's bits must not depend on where it sits (the
number of samples, a thread's chunk, a memory budget's pass), while the
program is generated for one number of samples.  Left to itself, the
compiler runs a vectorised loop's leftover elements through the scalar
function, and whether it vectorises a loop at all may change with the loop's
length.  So every element goes through the very same code:

- a nest's body is one *block function* computing :data:`BLOCK` consecutive
  elements from an offset, a ``#pragma omp simd`` loop of exactly ``BLOCK``
  iterations (a whole number of vectors at every register width: no tail),
  whose text does not depend on the number of elements and which the
  compiler may neither inline nor specialise (``noipa``): it is compiled the
  same way in every program;
- one call computes a run of blocks (:data:`CHUNK`; the runs are what a
  nest splits over threads), the last block moved back to end at the last
  element (a few elements are computed twice, the same values stored
  again); a nest of fewer than ``BLOCK`` elements calls it once on private
  copies padded with its last element and stores only its own.

A lane's result depends only on that lane's operands, so every element gets
the same bits wherever it is.  Only a *flat* nest of more than one element is
rewritten: a perfect nest of counted loops whose body stores one element of
its own index per line (``t3[i1] = sin(a0[i1]);``) and reads buffers only
at that index or at a fixed one (a Param's ``a2[0]``) -- what the lowering
makes of an elementwise chain -- wherever it sits: at the top of the program or inside
a scan's steps (a step's row of a buffer, ``(a0 + (row6)*37)[i7]``, is
passed to the block as a pointer of its own), never an element it has
already updated (read before the line storing it: the moved-back block
would update it twice).  Every other call (in a reduction's loop, a scan's step,
a branch) goes through a *lane function* (:func:`lane_calls`): the operand
put in every lane of a block, the same vector loop run over it, lane 0's
result returned.  So an ``exp`` gives one value for one operand wherever the
lowering put it -- in an elementwise chain, summed into a softmax's
denominator, in one fused program or split over two -- and a function's
first call (traced and run as separate programs) has the bits of its later
calls (one program).  The backend's check of the built library (every call
of one vector version, none scalar) builds the program again with lane
functions only where the compiler left a block's call scalar (a lane's loop
of one call always vectorises), and with scalar libm throughout only if that
fails too: one program never mixes the two.
"""

from __future__ import annotations

import re

from .libm import vector_math
from .lower import IDENTIFIER, calls_pattern, index_form, linear_index, row_major_strides
from .statements import Block, HelperCall, If, Loop, While, rebuilt

#: the libm functions the lowering calls that glibc's vector math library (libmvec) has in vector
#: versions: C name -> (type, arguments)
VECTOR_MATH = vector_math()

#: the line that marks a source whose loops run in SIMD registers, calling libm's vector versions
#: (a simulation's sample lanes, a graph program's vector blocks)
SIMD_MARKER = "/* vkml: sample lanes stepped in SIMD, libm calls in vector versions */"


#: functions called through a name of their own (an assembler label to libm's): GCC fuses a
#: ``sin`` and a ``cos`` of one argument into a scalar ``sincos`` call, which has no vector
#: version and keeps the loop scalar (a sine's vjp holds both)
_RENAMED = ("cos", "cosf")


def simd_declarations(names):
    """``names`` (of :data:`VECTOR_MATH`) declared to the compiler as having vector versions, so
    a ``#pragma omp simd`` loop calling them calls libmvec's ``_ZGV...`` functions instead."""
    lines = [SIMD_MARKER]
    for name in sorted(names):
        ctype, arity = VECTOR_MATH[name]
        args = ", ".join([ctype] * arity)
        lines.append("#pragma omp declare simd notinbranch")
        if name in _RENAMED:
            lines += [f'__attribute__((const)) {ctype} vk_simd_{name}({args}) __asm__("{name}");',
                      f"#define {name} vk_simd_{name}"]
        else:
            lines.append(f"{ctype} {name}({args});")
    return lines


#: elements one block function computes: 8 doubles (or floats) fill one AVX-512 register, two
#: AVX2 or four SSE ones, so a block is a whole number of vector iterations at every width
BLOCK = 8

#: blocks one call of a block function computes, one after another (a nest's calls are split
#: over threads by these chunks)
CHUNK = 64

#: the element index of a rewritten nest's lines (one flat index over the whole nest)
_FLAT = "vk_f"


def vectorised(stmts, names, ctypes):
    """``stmts`` with every flat nest (see the module docstring) that calls one of the functions
    ``names`` rewritten into calls of a block function; ``(statements, block functions' C)``.
    ``ctypes``: the C element type of every buffer a nest may touch, by name."""
    calls = calls_pattern(names)
    functions = []
    if calls is None:
        return stmts, functions

    def walk(body):
        out = []
        for s in body:
            nest = _Nest.of(s) if isinstance(s, Loop) else None
            types = nest.types(ctypes) if nest is not None else ctypes
            # (a nest of one element keeps its loop, its calls through lane functions: the
            # same bits as a padded block for a fraction of the work)
            if nest is not None and nest.elements > 1 and \
                    any(calls.search(line) for line in nest.body) and \
                    all(b in types for b in nest.buffers()):
                name = f"vk_block{len(functions)}"
                functions.append(nest.block_function(name, types, calls))
                call = nest.calls(name, types)
                if isinstance(call, Loop):
                    call.parallel = s.parallel         # (its blocks as independent as the elements)
                out += call if isinstance(call, list) else [call]
            elif isinstance(s, (Loop, Block, If, While)):   # a scan's steps: the nests inside
                before = len(functions)
                body = walk(s.body)
                out.append(s if len(functions) == before else rebuilt(s, body))
            else:
                out.append(s)
        return out

    return walk(stmts), functions


def calls_any(stmts, names) -> bool:
    """Whether a line of ``stmts`` (loop bodies, branch and loop tests included) calls one of
    the functions ``names``."""
    calls, found = calls_pattern(names), []
    if calls is not None:
        _map_lines(stmts, lambda text: found.append(calls.search(text)) or text)
    return any(found)


def lane_calls(stmts, names):
    """``stmts`` (those :func:`vectorised` left) with every remaining call of one of the
    functions ``names`` made a call of its *lane function*, and the lane functions' C:
    ``(statements, functions)``.  A lane function computes its operand through the very loop
    of a block function (:data:`BLOCK` lanes, ``#pragma omp simd``, never inlined), so it
    calls the vector version the blocks call and gives the value they give that operand."""
    calls = calls_pattern(names)
    if calls is None:
        return stmts, []
    used = set()

    def line(text):
        new = calls.sub(lambda m: used.add(m.group(1)) or f"vk_lane_{m.group(1)}(", text)
        if new == text:
            return text
        return HelperCall(new, text.reads) if isinstance(text, HelperCall) else new

    stmts = _map_lines(stmts, line)
    return stmts, [_lane_function(name) for name in sorted(used)]


def _map_lines(stmts, line):
    """``stmts`` with every line of C (loop bodies, branch and loop tests included) replaced by
    ``line(text)``."""
    out = []
    for s in stmts:
        if isinstance(s, str):
            out.append(line(s))
        elif isinstance(s, (Loop, Block, If, While)):
            out.append(rebuilt(s, _map_lines(s.body, line), line(getattr(s, "test", ""))))
        else:
            out.append(s)
    return out


def _lane_function(name):
    """The C of ``vk_lane_<name>``: ``name`` of its operands, computed in every lane of a
    block's vector loop and read back from lane 0."""
    ctype, arity = VECTOR_MATH[name]
    params = [f"vk_x{k}" for k in range(arity)]
    lines = [f"__attribute__((noipa)) static {ctype} vk_lane_{name}("
             f"{', '.join(f'{ctype} {p}' for p in params)}) {{",
             f"    {ctype} {', '.join(f'vk_in{k}[{BLOCK}]' for k in range(arity))}, vk_out[{BLOCK}];",
             f"    for (int64_t vk_l = 0; vk_l < {BLOCK}; vk_l++) {{ " +
             " ".join(f"vk_in{k}[vk_l] = {p};" for k, p in enumerate(params)) + " }",
             "    #pragma omp simd",
             f"    for (int64_t vk_l = 0; vk_l < {BLOCK}; vk_l++) vk_out[vk_l] = {name}(" +
             ", ".join(f"vk_in{k}[vk_l]" for k in range(arity)) + ");",
             "    return vk_out[0];",
             "}"]
    return "\n".join(lines)


#: a scan step's row of a buffer: ``(t31 + (row47)*1)[`` (buffer, row variable)
_ROW = re.compile(r"\(([A-Za-z_]\w*) \+ \(([A-Za-z_]\w*)\)\*\d+\)\[")

#: a line storing one element: ``name[...] = ...;``
_STORE = re.compile(r"^([A-Za-z_]\w*)\[.*;$")
#: a buffer read or written, and the index it is read at (no nested brackets)
_ACCESS = re.compile(r"(?<![\w])([A-Za-z_]\w*)\[([^\[\]]*)\]")


def _read_as(line, name, index, new):
    """``line`` with every read ``name[index]`` written ``new``."""
    return re.sub(rf"(?<![\w]){re.escape(f'{name}[{index}]')}", new, line)


class _Nest:
    """A flat nest: ``elements`` in all, its loop variables ``idx`` over ``extents``, and its
    lines, each storing one element at the flat index :data:`_FLAT` (``body``).  A buffer
    the nest does not store may be read at another index of the loop variables (a Param
    broadcast along a per-sample vector, ``t1[i4]``): ``gathers`` maps each such read to the
    private array a block gathers it into first."""

    def __init__(self, idx, extents, body, gathers, rows=None):
        self.idx, self.extents, self.body, self.gathers = idx, extents, body, gathers
        #: a scan's row of a buffer (``(t31 + (row47)*1)``) by the name the nest's lines give it
        self.rows = rows or {}
        self.elements = 1
        for e in extents:
            self.elements *= e

    def types(self, ctypes):
        """``ctypes`` with the C type of each row of a buffer the nest reads or writes."""
        rows = {alias: ctypes[base] for alias, (base, _) in self.rows.items() if base in ctypes}
        return {**ctypes, **rows} if rows else ctypes

    def _argument(self, b):
        """What the nest's caller passes for buffer ``b`` (a row: the pointer expression)."""
        return self.rows[b][1] if b in self.rows else b

    @classmethod
    def of(cls, loop):
        """The flat nest ``loop`` is, or None."""
        idx, extents = [], []
        while True:
            if not isinstance(loop.extent, int):
                return None
            idx.append(loop.var)
            extents.append(loop.extent)
            if len(loop.body) == 1 and isinstance(loop.body[0], Loop):
                loop = loop.body[0]
                continue
            if not loop.body or not all(isinstance(line, str) for line in loop.body):
                return None
            break
        here = linear_index(idx, extents)
        moving = [v for v, e in zip(idx, extents) if e != 1]     # (an index of one value is 0)
        fixed = set(idx) - set(moving)
        flat_form = index_form(here, moving, fixed)
        # a scan step's row of a buffer, ``(t31 + (row47)*1)[i48]``: named for the nest (its
        # block function takes the row's pointer), unless its offset moves with the nest's loops
        rows = {}

        def row(m):
            if m.group(2) in idx:
                return m.group(0)
            text = m.group(0)[:-1]
            alias = next((a for a, (_, t) in rows.items() if t == text), None)
            if alias is None:
                alias = f"vk_row{len(rows)}"
                rows[alias] = (m.group(1), text)
            return alias + "["
        lines = [_ROW.sub(row, line) for line in loop.body]
        stored = [_STORE.match(line).group(1) if _STORE.match(line) else None for line in lines]
        if None in stored:
            return None

        def flat_spelled(index):
            return index_form(index, moving, fixed) == flat_form
        # buffers read somewhere at another element: every read of them stays a gather (a nest
        # of fewer elements than a block passes what it reads at the flat index as padded copies)
        gathered = {name for line in lines for name, index in _ACCESS.findall(line)
                    if index != here and not index.isdigit() and not flat_spelled(index)}
        body, gathers = [], {}
        for at, (line, target) in enumerate(zip(lines, stored)):
            # an element read before this nest stores it (``t4[i] = t4[i] + ...``): computed
            # twice where the last block moves back, it would be updated twice
            if any(name in stored[at:] and index == here for name, index in _ACCESS.findall(
                    line.split(" = ", 1)[1] if " = " in line else line)):
                return None
            if not line.startswith(f"{target}[{here}] = ") or \
                    line.count("[") != len(_ACCESS.findall(line)):
                return None            # a nested index, or a read through a cast pointer
            for name, index in _ACCESS.findall(line):
                if index.isdigit() or name not in gathered and index == here:
                    continue
                if name not in stored and name not in gathered and flat_spelled(index):
                    # the flat index spelled another way (a reshape's read): read where it is
                    line = _read_as(line, name, index, f"{name}[{here}]")
                    continue
                if name in stored:
                    return None        # another element of what the nest computes
                if "?" in line:
                    return None        # a read a condition may guard (a pad's): gathered, it
                    #                    would be read unguarded
                gathers.setdefault((name, index), f"vk_g{len(gathers)}")
            for (name, index), g in gathers.items():
                line = _read_as(line, name, index, f"{g}[vk_l]")
            line = re.sub(rf"(?<![\w])([A-Za-z_]\w*)\[{re.escape(here)}\]",
                          lambda m: f"{m.group(1)}[{_FLAT}]", line)
            if set(IDENTIFIER.findall(line)) & set(idx):
                return None            # a loop variable outside an index (a strided pad's
                #                        condition): the block function has no such variable
            body.append(line)
        return cls(idx, extents, body, gathers, rows)

    def buffers(self):
        """The buffers the nest touches, in order of appearance (then those it gathers from)."""
        seen = [name for line in self.body for name, _ in _ACCESS.findall(line)
                if not name.startswith("vk_g")]
        return list(dict.fromkeys(seen + [name for name, _ in self.gathers]))

    def stored(self):
        return list(dict.fromkeys(_STORE.match(line).group(1) for line in self.body))

    def at_flat(self):
        """The buffers read or written at the flat index."""
        return list(dict.fromkeys(name for line in self.body for name, index in _ACCESS.findall(line)
                                  if index == _FLAT))

    def block_function(self, name, ctypes, calls):
        """The C of block function ``name``: the nest's lines for blocks ``vk_b0`` to ``vk_b1`` of
        ``vk_n`` elements, each block's ``BLOCK`` elements from ``vk_at``, each buffer a parameter
        of its own name.  Its text holds neither the number of elements nor where the blocks
        start (they are arguments).  The lines
        after the last one that calls a vector function (``calls``) run in a loop of their own
        after the vector loop: a comparison stored as a byte (a simulation's "terminated") would
        keep GCC 12 from vectorising a loop of doubles."""
        params = ", ".join(f"{ctypes[b]}* {b}" for b in self.buffers())
        lines = [f"    const int64_t vk_at = vk_b * {BLOCK} + {BLOCK} <= vk_n || vk_n < {BLOCK} ? "
                 f"vk_b * {BLOCK} : vk_n - {BLOCK};"]
        if self.gathers:
            lines += self._gathers(ctypes)
        body = self.body
        # Elements read at a fixed index (a Param's ``a2[0]``, a 0-d temporary ``t1[0]``) are
        # read once, before the loops: the loops then see values that do not change, which the
        # compiler broadcasts -- a byte read per element beside doubles (a condition ``t1[0]``
        # held as a bool) would keep GCC 12 from vectorising the loop at all.
        stored = self.stored()
        fixed = list(dict.fromkeys((b, index) for line in body for b, index in _ACCESS.findall(line)
                                   if index.isdigit() and b not in stored))
        for k, (b, index) in enumerate(fixed):
            lines.append(f"    const {ctypes[b]} vk_c{k} = {b}[{index}];")
            body = [re.sub(rf"(?<![\w]){re.escape(b)}\[{index}\]", f"vk_c{k}", line) for line in body]
        last = max(i for i, line in enumerate(body) if calls.search(line))
        for pragma, part in (("    #pragma omp simd", body[:last + 1]), (None, body[last + 1:])):
            if not part:
                continue
            lines += ([pragma] if pragma else []) + \
                [f"    for (int64_t vk_l = 0; vk_l < {BLOCK}; vk_l++) {{"]
            lines += ["        " + line.replace(f"[{_FLAT}]", "[vk_at + vk_l]") for line in part]
            lines.append("    }")
        head = [f"__attribute__((noipa)) static void {name}(int64_t vk_b0, int64_t vk_b1, "
                f"int64_t vk_n, {params}) {{", "    for (int64_t vk_b = vk_b0; vk_b < vk_b1; vk_b++) {"]
        return "\n".join(head + ["    " + line for line in lines] + ["    }", "}"])

    def _gathers(self, ctypes):
        """The lines filling each gathered read's private array for the block at ``vk_at``.  A
        block inside one row of the innermost loop (every block, where the row is a whole number
        of blocks) takes the outer loops' indices from its first element and the innermost one
        counting up from there: no division per element, reads the compiler vectorises (a
        Param broadcast along the rows, a row read in place).  Any other block (one crossing a
        row's end, a nest of fewer elements than a block) takes each element's indices from its
        flat index.  The values gathered are the same either way."""
        strides = row_major_strides(self.extents)

        def coords(flat, names):
            return [f"const int64_t {v} = ({flat} / {st})" + (f" % {e};" if k else ";")
                    for k, (v, st, e) in enumerate(zip(names, strides, self.extents))]

        def fill(first):
            out = [f"for (int64_t vk_l = 0; vk_l < {BLOCK}; vk_l++) {{"] + ["    " + c for c in first]
            out += [f"    (void){v};" for v in self.idx]
            out += [f"    {g}[vk_l] = {b}[{index}];" for (b, index), g in self.gathers.items()]
            return out + ["}"]
        first = [f"vk_h{k}" for k in range(len(self.idx))]
        inner, row = self.idx[-1], self.extents[-1]
        same_row = [f"const int64_t {v} = {h};" for v, h in zip(self.idx[:-1], first[:-1])]
        same_row.append(f"const int64_t {inner} = {first[-1]} + vk_l;")
        each = [f"const int64_t {_FLAT} = vk_at + vk_l < vk_n ? vk_at + vk_l : vk_n - 1;"]
        each += coords(_FLAT, self.idx)
        lines = [f"{ctypes[b]} {g}[{BLOCK}];" for (b, _), g in self.gathers.items()]
        lines += coords("vk_at", first) + [f"(void){h};" for h in first]
        lines += [f"if ({first[-1]} + {BLOCK} <= {row} && vk_at + {BLOCK} <= vk_n) {{"]
        lines += ["    " + line for line in fill(same_row)] + ["} else {"]
        lines += ["    " + line for line in fill(each)] + ["}"]
        return ["    " + line for line in lines]

    def calls(self, name, ctypes):
        """The nest as calls of its block function (module docstring)."""
        n = self.elements
        if n >= BLOCK:
            blocks = -(-n // BLOCK)
            args = ", ".join(self._argument(b) for b in self.buffers())
            if blocks <= CHUNK:
                return [f"{name}(0, {blocks}, {n}, {args});"]
            end = f"(vk_c * {CHUNK} + {CHUNK} <= {blocks} ? vk_c * {CHUNK} + {CHUNK} : {blocks})"
            return Loop("vk_c", -(-blocks // CHUNK), [f"{name}(vk_c * {CHUNK}, {end}, {n}, {args});"])
        # fewer elements than a block: private copies of what is read and written at the flat
        # index, padded with the last element
        flat, stored = self.at_flat(), self.stored()
        lines = [f"{ctypes[b]} vk_p_{b}[{BLOCK}];" for b in flat]
        last = f"({_FLAT} < {n} ? {_FLAT} : {n - 1})"
        lines += [f"for (int64_t {_FLAT} = 0; {_FLAT} < {BLOCK}; {_FLAT}++) "
                  f"vk_p_{b}[{_FLAT}] = {self._argument(b)}[{last}];" for b in flat if b not in stored]
        args = ", ".join(f"vk_p_{b}" if b in flat else self._argument(b) for b in self.buffers())
        lines.append(f"{name}(0, 1, {n}, {args});")
        lines += [f"for (int64_t {_FLAT} = 0; {_FLAT} < {n}; {_FLAT}++) "
                  f"{self._argument(b)}[{_FLAT}] = vk_p_{b}[{_FLAT}];" for b in stored]
        return Block(lines)
