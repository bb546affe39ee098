"""Elementwise loop nests in SIMD registers, their libm calls in glibc's vector versions (libmvec).

Why: a graph kernel's launch and reverse are batched programs over every
sample, and the loop nest that computes ``sin(k * u)`` for 10^3 samples
spent most of its time in glibc's scalar ``sin``; libmvec's vector ``sin``
computes 4 or 8 of them at once.

The catch is the loop's tail.  Left to itself, the compiler runs a vectorised
loop's leftover elements through the scalar function, so a sample's bits would
depend on where it sits (the number of samples, a thread's chunk, a memory
budget's pass).  Here every element goes through the very same vector code:
a nest over ``N`` elements runs in blocks of :data:`BLOCK` elements, each a
``#pragma omp simd`` loop of exactly ``BLOCK`` iterations (a multiple of every
vector width, so there is no tail inside a block), the last block moved back
to end at ``N`` (it recomputes a few elements with the same code and stores the
same values again); and a nest of fewer than ``BLOCK`` elements runs one block
on private copies padded with its last element, of which only the first
``N`` results are stored.  A lane's result depends only on that lane's
operands, so every element gets the same bits wherever it is.

Only a *flat* nest is rewritten: a perfect nest of counted loops whose body
stores one element of its own index per line (``t3[i1] = sin(a0[i1]);``) and
reads buffers only at that index or at a fixed one (a Param's ``a2[0]``) --
what the lowering makes of an elementwise chain.  Anything else keeps its
scalar calls; the backend's check of the built library (every call of one
vector version, none scalar) then builds the program again with scalar libm
throughout, so one program never mixes the two.
"""

from __future__ import annotations

import re

from .statements import Block, Loop

#: the libm functions the lowering calls that glibc's vector math library (libmvec) has in vector
#: versions: C name -> (type, arguments)
VECTOR_MATH = {f"{name}{suffix}": (ctype, 2 if name in ("pow", "atan2") else 1)
               for name in ("exp", "log", "sin", "cos", "tanh", "pow", "log1p", "expm1", "erf",
                            "atan2")
               for suffix, ctype in (("", "double"), ("f", "float"))}

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


#: elements one vector block computes: 8 doubles (or floats) fill one AVX-512 register, two
#: AVX2 or four SSE ones, so a block is a whole number of vector iterations at every width
BLOCK = 8

#: the element index of a rewritten nest (one flat index over the whole nest)
_FLAT = "vk_f"


def vectorised(stmts, names):
    """``stmts`` with every flat nest (see the module docstring) that calls one of the functions
    ``names`` rewritten into vector blocks; ``(statements, how many nests were rewritten)``."""
    calls = re.compile(r"(?<![\w])(?:" + "|".join(sorted(map(re.escape, names))) + r")\(") \
        if names else None
    out, count = [], 0
    for s in stmts:
        flat = _flat_nest(s) if calls is not None and isinstance(s, Loop) else None
        if flat is not None and any(calls.search(line) for line in flat[1]):
            out.append(_blocks(*flat))
            count += 1
        else:
            out.append(s)
    return out, count


def _flat_nest(loop):
    """``(elements, body)`` of a flat nest, its body's lines indexed by :data:`_FLAT`; None for
    any other statement."""
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
    from .lower import linear_index   # local: lower imports statements, as this module does
    here = f"[{linear_index(idx, extents)}]"
    body = []
    for line in loop.body:
        m = _STORE.match(line)
        if m is None or not line.startswith(here + " = ", m.end(1)):
            return None
        if any(f"[{index}]" != here and not index.isdigit() for index in _INDEX.findall(line)):
            return None
        line = line.replace(here, f"[{_FLAT}]")
        if len(_AT_FLAT.findall(line)) != line.count(f"[{_FLAT}]"):
            return None             # read through a cast pointer (a constant's array): not copied
        body.append(line)
    elements = 1
    for e in extents:
        elements *= e
    return elements, body


#: a line storing one element: ``name[...] = ...;``
_STORE = re.compile(r"^([A-Za-z_]\w*)\[.*;$")
#: every index a line reads or writes at (no nested brackets: a gather's index is not flat)
_INDEX = re.compile(r"\[([^\[\]]*)\]")
#: a buffer read or written at the flat index
_AT_FLAT = re.compile(r"(?<![\w])([A-Za-z_]\w*)\[" + _FLAT + r"\]")


def _blocks(elements, body):
    """The statements of a flat nest of ``elements`` in vector blocks (module docstring)."""
    if elements >= BLOCK:
        start = "vk_b0"
        return Loop("vk_b", -(-elements // BLOCK), [
            f"const int64_t {start} = vk_b * {BLOCK} + {BLOCK} <= {elements} ? vk_b * {BLOCK} "
            f": {elements - BLOCK};",
            # a count of exactly BLOCK (not up to start + BLOCK, which may wrap around under
            # -fwrapv: the compiler would then keep a scalar tail)
            "#pragma omp simd",
            f"for (int64_t vk_l = 0; vk_l < {BLOCK}; vk_l++) {{",
            *["    " + line.replace(f"[{_FLAT}]", f"[{start} + vk_l]") for line in body],
            "}"])
    return Block(_padded_block(elements, body))


def _padded_block(elements, body):
    """One block over private copies of the nest's buffers, padded with its last element: the
    buffers it reads are copied in, the ones it stores are copied out for the first
    ``elements`` only."""
    stored = [_STORE.match(line).group(1) for line in body]
    touched = []
    for line in body:
        for name in _AT_FLAT.findall(line):
            if name not in touched:
                touched.append(name)
    read = [name for name in touched if name not in stored]
    lines = [f"__typeof__({name}[0]) vk_p_{name}[{BLOCK}];" for name in touched]
    last = f"({_FLAT} < {elements} ? {_FLAT} : {elements - 1})"
    if read:
        lines.append(f"for (int64_t {_FLAT} = 0; {_FLAT} < {BLOCK}; {_FLAT}++) {{ " +
                     " ".join(f"vk_p_{name}[{_FLAT}] = {name}[{last}];" for name in read) + " }")
    private = [_AT_FLAT.sub(lambda m: f"vk_p_{m.group(1)}[{_FLAT}]", line) for line in body]
    lines += ["#pragma omp simd",
              f"for (int64_t {_FLAT} = 0; {_FLAT} < {BLOCK}; {_FLAT}++) {{",
              *["    " + line for line in private],
              "}",
              f"for (int64_t {_FLAT} = 0; {_FLAT} < {elements}; {_FLAT}++) {{ " +
              " ".join(f"{name}[{_FLAT}] = vk_p_{name}[{_FLAT}];" for name in dict.fromkeys(stored)) + " }"]
    return lines
