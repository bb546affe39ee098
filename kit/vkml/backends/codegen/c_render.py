"""The C renderer: lowered statements as one C function for the CPU tier.

The function takes ``void** in`` and ``void** out`` (contiguous buffers the
backend allocates) and returns 0, or an error code naming the primitive that
failed (a gather index out of range, say; its details in ``info``), or
:data:`ALLOCATION_FAILED` when a temporary could not be allocated
(``info[0]``: its place in ``lowering.temps``, ``info[1]``: its bytes).
Nothing is written past a failed allocation: every temporary is allocated,
and checked, before any statement runs.

A fourth argument, ``const volatile int* vk_stop``, is the interrupt flag
(``backends.interrupts``): scans and while loops poll it every few
iterations (:data:`POLL`, placed by the lowering) and, once it is set, the
function frees its temporaries and returns :data:`INTERRUPTED`; the caller
commits nothing of such a call.

A long body (a training step's forward, backward and update) is compiled as a
few part functions called in turn (:func:`split_body`): the C compiler's time
grows faster than linearly with one function's size, and a transformer step
compiles in 1.6 s instead of 2.3 s so.  The statements and their order are the
same, so are the bits.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from pathlib import Path

from .libm import declarations
from .lower import CTYPE, IDENTIFIER, SIMD_LOOP
from .gemm import pointer_declarations
from .statements import Block, If, Loop, While, leaves
from .threaded_nests import collapsed_by, threaded
from .vector_nests import lane_calls, simd_declarations, vectorised

# No #include: parsing system headers is most of a small compile's time, so the few
# declarations generated code needs are written out here.
HELPERS = r"""
typedef signed char int8_t; typedef int int32_t; typedef long long int64_t;
typedef unsigned char uint8_t; typedef unsigned int uint32_t; typedef unsigned long long uint64_t;
void* malloc(unsigned long); void free(void*);
#define NAN (__builtin_nanf(""))
#define INFINITY (__builtin_inff())

#define VK_FN static inline __attribute__((always_inline))
/* where(c, a, b) on floats as a select of bits: a loop the compiler leaves scalar (a gather it
   cannot vectorise) would otherwise branch on the condition -- a ReLU's gradient on random signs
   mispredicts every other element (4 ns each; a CNN step 46 -> 40 ms on one core) */
#define VK_WHERE_BITS 1
""" + declarations()


def _row_tree_helpers() -> str:
    """``vk_tree_row_float`` / ``_double(buf, n)``: the canonical tree of the ``n`` values at
    ``buf`` (a power of two, at least 16; 64-byte aligned), summed in place level by level.
    Each level adds adjacent pairs, the earlier on the left -- in vectors, where two shuffles
    (the even lanes of two vectors, the odd lanes) and one add make a vector of pair sums in
    order -- until one vector is left, which pairs with itself until its first lane holds the
    sum (the other lanes repeat it or hold pairs nobody reads): the additions of
    ``vk_tree_push`` on the same values, so the same bits.  Without ``__builtin_shufflevector``
    (GCC before 12, or ``VK_ROW_NO_SHUFFLE`` defined: the tests) every level is the scalar loop."""
    lines = ["#if !defined(VK_ROW_NO_SHUFFLE) && (defined(__clang__) || __GNUC__ >= 12)",
             "#if defined(__AVX512F__)", "#define VK_ROW_VBYTES 64",
             "#elif defined(__AVX__)", "#define VK_ROW_VBYTES 32",
             "#else", "#define VK_ROW_VBYTES 16", "#endif"]
    for vbytes in (64, 32, 16):
        lines.append(f"#{'if' if vbytes == 64 else 'elif'} VK_ROW_VBYTES == {vbytes}")
        for t, size in (("float", 4), ("double", 8)):
            lanes = vbytes // size
            even = ", ".join(str(2 * i) for i in range(lanes))
            odd = ", ".join(str(2 * i + 1) for i in range(lanes))
            lines.append(f"#define VK_ROW_PAIRS_{t}(a, b) (__builtin_shufflevector(a, b, {even}) "
                         f"+ __builtin_shufflevector(a, b, {odd}))")
    lines += ["#endif", "#define VK_ROW_VECTORS 1", "#else", "#define VK_ROW_VBYTES 16",
              "#define VK_ROW_VECTORS 0", "#endif"]
    for t in ("float", "double"):
        lines += [
            f"typedef {t} vk_row_v{t} __attribute__((vector_size(VK_ROW_VBYTES), may_alias));",
            f"VK_FN {t} vk_tree_row_{t}({t}* buf, int64_t n) {{",
            f"    const int64_t lanes = VK_ROW_VBYTES / sizeof({t});",
            "#if VK_ROW_VECTORS",
            f"    vk_row_v{t}* v = (vk_row_v{t}*)buf;",
            "    _Pragma(\"GCC unroll 8\")",
            "    for (; n > lanes; n >>= 1) {",
            "        _Pragma(\"GCC unroll 8\")",
            "        for (int64_t i = 0; i < n / lanes / 2; i++)",
            f"            v[i] = VK_ROW_PAIRS_{t}(v[2 * i], v[2 * i + 1]);",
            "    }",
            f"    vk_row_v{t} w = v[0];",
            "    _Pragma(\"GCC unroll 4\")",
            f"    for (; n > 1; n >>= 1) w = VK_ROW_PAIRS_{t}(w, w);",
            "    return w[0];",
            "#endif",
            "    for (; n > 1; n >>= 1)",
            "        for (int64_t i = 0; i < n / 2; i++) buf[i] = buf[2 * i] + buf[2 * i + 1];",
            "    return buf[0];",
            "}"]
    return "\n".join(lines) + "\n"


HELPERS += _row_tree_helpers()


def template(name: str) -> str:
    """A file of ``kernels_cu/``: read from the checkout this module sits in when vkml runs from
    source (so an edited template is the one used, whatever is installed), else the copy shipped
    in the wheel as ``vkml.kernels_cu``."""
    checkout = Path(__file__).resolve().parents[4] / "kernels_cu" / name
    if checkout.is_file():
        return checkout.read_text()
    return importlib.resources.files("vkml.kernels_cu").joinpath(name).read_text()


@functools.lru_cache(maxsize=None)
def prelude() -> str:
    """What every generated C file starts with: declarations, then the shared scalar helpers."""
    return HELPERS + template("helpers.h")


#: temporaries of at most this many elements live on the stack
STACK_LIMIT = 64
#: what a generated function returns when malloc refused a temporary
ALLOCATION_FAILED = -1
#: what a generated function returns when it stopped at an interrupt (its outputs half-written)
INTERRUPTED = -2
#: the poll of the interrupt flag before every few iterations of a long loop (one load and a
#: branch that is never taken until Ctrl-C), leaving through the function's clean-up
POLL = f"if (*vk_stop) {{ *err = {INTERRUPTED}; goto done; }}"


#: bytes each temporary's place in a caller's scratch block is aligned to
SCRATCH_ALIGN = 64
#: a temporary of at least a page starts 0, 1, 2, ... lines (in the order they are placed, modulo
#: a page) past its place, so that arrays of power-of-two sizes do not all start at one offset
#: modulo the page -- one L1 cache set for all of them: a reverse reading twelve saved 8 MB
#: trajectories at one index per step ran 9% faster once they started on twelve lines.  Placed
#: end to end, the n-th starts n(n+1)/2 lines past a page boundary: distinct for 64 in a row
SCRATCH_PAGE = 4096


def scratch_layout(temps, stmts=None):
    """``(offsets, total bytes)``: where each heap temporary of ``temps`` (the lowering's
    ``(name, ctype, count)``; None for one on the stack) lies in a caller's scratch block.

    With ``stmts``, the body's top-level statements in the order they run, temporaries share
    bytes where their lives do not overlap -- a life runs from the first statement that names
    the temporary to the last (a loop is one statement: whatever its body names lives through
    all of it; statements never run at the same time, their threads joining at each one's
    end).  Each temporary takes the lowest place free of every temporary alive with it, so a
    step's block is a few of its largest values, not all of them: the bytes a nest or product
    writes were used a few statements before and are still in the caches, where a block of
    every temporary (a transformer step's 48 MB, past the L3 cache) made every first write of
    a step a miss to memory."""
    sizes = [None if count <= STACK_LIMIT else -(-CSIZE[ctype] * count // SCRATCH_ALIGN) * SCRATCH_ALIGN
             for _, ctype, count in temps]
    if stmts is None:
        offsets, total = [], 0
        for size in sizes:
            offsets.append(None if size is None else total)
            total += size or 0
        return offsets, total
    slot = {name: k for k, (name, _, _) in enumerate(temps) if sizes[k] is not None}
    first, last = {}, {}
    for at, stmt in enumerate(stmts):
        text = []
        emit([stmt], text, "")
        for name in set(re.findall(r"\bt\d+\b", "\n".join(text))) & slot.keys():
            first.setdefault(slot[name], at)
            last[slot[name]] = at
    offsets = [None] * len(temps)
    live, total = [], 0                  # (offset, end, last statement) of the placed ones
    coloured = 0
    for k in sorted(first, key=lambda k: (first[k], k)):
        shift = 0
        if sizes[k] >= SCRATCH_PAGE:
            shift = SCRATCH_ALIGN * (coloured % (SCRATCH_PAGE // SCRATCH_ALIGN))
            coloured += 1
        need = shift + sizes[k]
        live = sorted((p for p in live if p[2] >= first[k]), key=lambda p: p[0])
        place = 0
        for start, end, _ in live:
            if place + need <= start:
                break
            place = max(place, end)
        offsets[k] = place + shift
        live.append((place, place + need, last[k]))
        total = max(total, place + need)
    for k, size in enumerate(sizes):     # named by no statement: never read or written
        if size is not None and offsets[k] is None:
            offsets[k] = 0
            total = max(total, size)
    return offsets, total


CSIZE = {"double": 8, "float": 4, "int64_t": 8, "int32_t": 4, "int8_t": 1, "uint8_t": 1,
         "uint32_t": 4, "uint64_t": 8}


def render(lowering, stmts, n_in, in_types, n_out, out_types, name="vk_main", data_offset=None,
           vector_math=(), blocks=True, split=True, threads=1, units=1):
    """The program as C: ``name(in, out, info, vk_stop)`` over data pointers, its temporaries
    malloc'ed and freed per call; with ``data_offset`` (where a NumPy array object keeps its data
    pointer) also ``vk_objs`` (see :func:`_objects_entry`).  ``vector_math``: libm functions
    whose calls run in vector blocks in elementwise loop nests and through lane functions
    elsewhere (``vector_nests``; the source then needs ``-fopenmp-simd``); without ``blocks``,
    through lane functions everywhere.  ``split``: a long body may be compiled as part
    functions (:func:`split_body`).  ``threads``: big parallel nests split over that many
    OpenMP threads (``threaded_nests``; the source then needs ``-fopenmp``).  ``units``: a body
    cut into part functions may be written as that many compilation units (:func:`units_of`),
    which the compilers build side by side."""
    # the products call the GEMM library through pointers (``gemm.library_source``)
    lines = [prelude()] + ([pointer_declarations(sorted(lowering.gemm_types))]
                           if lowering.gemm_types else [])
    buffers = {f"a{i}": CTYPE[t] for i, t in enumerate(in_types)}
    buffers.update({f"o{i}": CTYPE[t] for i, t in enumerate(out_types)})
    buffers.update({tname: ctype for tname, ctype, _ in lowering.temps})
    lowering.scratch = scratch_layout(lowering.temps, stmts)
    stmts, block_functions = vectorised(stmts, vector_math, buffers) if blocks else (stmts, [])
    stmts, lanes = lane_calls(stmts, vector_math)
    stmts = threaded(stmts, threads)
    if block_functions or lanes:
        lines += simd_declarations(vector_math)
    lines += lowering.statics
    lines += block_functions + lanes
    offsets = lowering.scratch[0]
    head = len(lines)              # (where part functions go, before the body that calls them)
    lines.append("static int vk_main_body(void** in, void** out, int64_t* info, const volatile int* vk_stop, "
                 "char* vk_scratch) {")
    lines.append("    int err_ = 0; int* err = &err_; (void)err; (void)info; (void)vk_stop;")
    for i, t in enumerate(in_types):
        lines.append(f"    {CTYPE[t]}* a{i} = ({CTYPE[t]}*)in[{i}];")
    for i, t in enumerate(out_types):
        lines.append(f"    {CTYPE[t]}* o{i} = ({CTYPE[t]}*)out[{i}];")
    for tname, ctype, count in lowering.temps:
        if count <= STACK_LIMIT:
            # small temporaries on the stack: their address never escapes, so the compiler keeps
            # them in registers (a scan's scalar carry)
            lines.append(f"    {ctype} {tname}[{count}];")
        else:
            lines.append(f"    {ctype}* {tname} = 0;")
    for slot, (tname, ctype, count) in enumerate(lowering.temps):
        if count > STACK_LIMIT:
            nbytes = f"sizeof({ctype}) * {count}ULL"
            lines.append(f"    {tname} = vk_scratch ? ({ctype}*)(vk_scratch + {offsets[slot]}ULL) "
                         f": ({ctype}*)malloc({nbytes});")
            lines.append(f"    if (!{tname}) {{ info[0] = {slot}; info[1] = (int64_t)({nbytes}); "
                         f"err_ = {ALLOCATION_FAILED}; goto done; }}")
    parts = split_body(stmts, in_types, out_types, lowering.temps) if split else None
    if parts is None:
        emit(stmts, lines, "    ", simd=True)
    else:
        functions, passed = parts
        apart = _apart(functions) if units > 1 else 0
        if apart:
            # the last parts in a unit of their own: the same header (the GEMM pointers read
            # from the first unit), the functions visible to the first unit's body
            header = lines[:head]
            if lowering.gemm_types:
                header[1] = pointer_declarations(sorted(lowering.gemm_types), extern=True)
            second = [f.replace(_PART_HEAD, _SHARED_PART_HEAD, 1) for f in functions[-apart:]]
            functions = functions[:-apart] + [
                f"{_SHARED_PART_HEAD}{k}(void** in, void** out, int64_t* info, "
                "const volatile int* vk_stop, void** vk_t);"
                for k in range(len(functions) - apart, len(functions))]
        lines[head:head] = functions
        lines.append(f"    void* vk_t[{max(1, len(passed))}];")
        lines += [f"    vk_t[{k}] = {tname};" for k, tname in enumerate(passed)]
        lines += [f"    if ((err_ = vk_part{k}(in, out, info, vk_stop, vk_t)) != 0) goto done;"
                  for k in range(len(functions))]
    lines.append("    goto done;")
    lines.append("done:")
    for tname, _, count in lowering.temps:
        if count > STACK_LIMIT:
            lines.append(f"    if (!vk_scratch) free({tname});")
    lines.append("    return err_;")
    lines.append("}")
    lines.append(f"int {name}(void** in, void** out, int64_t* info, const volatile int* vk_stop) {{")
    lines.append("    return vk_main_body(in, out, info, vk_stop, 0);")
    lines.append("}")
    if data_offset is not None:
        lines += _objects_entry(n_in, n_out, 3 + len(lowering.warnings), data_offset)
    if parts is not None and units > 1 and apart:
        lines += [UNIT_MARKER] + header + second
    return "\n".join(lines) + "\n"


#: the line between two compilation units of one program's source (:func:`units_of`)
UNIT_MARKER = "//@vkml-unit"

#: a part function's head, and the same visible to another unit of the program
_PART_HEAD = "__attribute__((noinline)) static int vk_part"
_SHARED_PART_HEAD = '__attribute__((noinline, visibility("hidden"))) int vk_part'


def _apart(functions) -> int:
    """How many of the last part functions go into a second unit: about half the C."""
    total, tail = sum(map(len, functions)), 0
    for k in range(len(functions) - 1, 0, -1):
        tail += len(functions[k])
        if tail * 2 >= total:
            return len(functions) - k
    return 0


def units_of(source) -> list:
    """The compilation units of a program's ``source``: one, or those :data:`UNIT_MARKER` lines
    part (each compiles on its own; linked together they are the program)."""
    return source.split("\n" + UNIT_MARKER + "\n")


#: a program body whose statements' C is longer than this is compiled as several functions of
#: about :data:`PART_BYTES` each: the compiler's register allocation and loop passes grow faster
#: than linearly with a function's size (a transformer step's 100 KB body took 2 s at -O1)
SPLIT_BYTES = 24 * 1024
PART_BYTES = 12 * 1024

#: a 0-d argument read once into a local (``Lowering.scalars_in_locals``): copied into each part
_SCALAR_LOCAL = re.compile(r"const \w+ (\w+) = a\d+\[0\];")
#: a declaration at the top of the body: ``type name`` or ``type* name``
_DECLARATION = re.compile(r"(?:const )?[A-Za-z_]\w*\** \**([A-Za-z_]\w*)(?: = |\[|;)")


def split_body(stmts, in_types, out_types, temps):
    """A long body as ``(part functions' C, temporaries passed to them)``, or None to keep it
    whole.  The top-level statements are cut into runs of about :data:`PART_BYTES` of C, each
    run a function ``vk_part<k>(in, out, info, vk_stop, vk_t)`` that the body calls in turn and
    that returns its error code (its checks leave through its own ``done``).  Each part
    declares the arguments it names, reads the heap temporaries and the stack ones several
    parts share through ``vk_t`` and holds a stack temporary only it uses as its own.  A cut
    never parts a variable declared in the body from a later use (0-d arguments read into
    locals are read again in each part that uses them)."""
    texts = []
    for st in stmts:
        out = []
        emit([st], out, "    ", simd=True)
        texts.append("\n".join(out))
    if sum(map(len, texts)) <= SPLIT_BYTES:
        return None
    names = [set(IDENTIFIER.findall(t)) for t in texts]
    scalars, scalar_lines, last_use = {}, set(), {}
    for k, st in enumerate(stmts):
        if isinstance(st, str):
            local = _SCALAR_LOCAL.fullmatch(st)
            if local:
                scalars[local.group(1)] = st
                scalar_lines.add(k)
                continue
            declared = _DECLARATION.match(st)
            if declared:
                last_use[declared.group(1)] = k
    for name in last_use:
        last_use[name] = max(k for k, used in enumerate(names) if name in used)
    runs, run, size, open_until = [], [], 0, -1
    for k, text in enumerate(texts):
        if k in scalar_lines:
            continue
        run.append(k)
        size += len(text)
        for name, end in last_use.items():
            if name in names[k]:
                open_until = max(open_until, end)
        if size >= PART_BYTES and open_until <= k:
            runs.append(run)
            run, size = [], 0
    if run:
        runs.append(run)
    if len(runs) < 2:
        return None
    arguments = {f"a{i}": t for i, t in enumerate(in_types)}
    results = {f"o{i}": t for i, t in enumerate(out_types)}
    used_by = [set().union(*(names[k] for k in run)) for run in runs]
    for used in used_by:            # a 0-d argument read into a local: the argument too
        used.update(IDENTIFIER.findall(" ".join(line for name, line in scalars.items()
                                                 if name in used)))
    stack = {tname for tname, _, count in temps if count <= STACK_LIMIT}
    shared = [tname for tname, _, count in temps
              if tname not in stack or sum(tname in u for u in used_by) > 1]
    slot = {tname: k for k, tname in enumerate(shared)}
    functions = []
    for p, (run, used) in enumerate(zip(runs, used_by)):
        lines = [f"{_PART_HEAD}{p}(void** in, void** out, "
                 "int64_t* info, const volatile int* vk_stop, void** vk_t) {",
                 "    int err_ = 0; int* err = &err_; (void)err; (void)info; (void)vk_stop; "
                 "(void)in; (void)out; (void)vk_t;"]
        lines += [f"    {CTYPE[t]}* {a} = ({CTYPE[t]}*)in[{a[1:]}];"
                  for a, t in arguments.items() if a in used]
        lines += [f"    {CTYPE[t]}* {o} = ({CTYPE[t]}*)out[{o[1:]}];"
                  for o, t in results.items() if o in used]
        for tname, ctype, count in temps:
            if tname not in used:
                continue
            if tname in slot:
                lines.append(f"    {ctype}* {tname} = ({ctype}*)vk_t[{slot[tname]}];")
            else:
                lines.append(f"    {ctype} {tname}[{count}];")
        lines += ["    " + line for name, line in scalars.items() if name in used]
        emit([stmts[k] for k in run], lines, "    ", simd=True)
        lines += ["    goto done;", "done:", "    return err_;", "}"]
        functions.append("\n".join(lines))
    return functions, shared


def _objects_entry(n_in, n_out, n_info, data_offset):
    """``vk_objs(objs, info, vk_stop)``: the program called with NumPy array *objects* -- the
    inputs, the outputs, then a scratch block for the heap temporaries (or 0: malloc) -- whose data
    pointers it reads at ``data_offset`` in each object (NumPy's array struct starts with the
    object header, then its data pointer).  Python then hands over one prepared block of object
    addresses, which costs far less per call than asking each array for its data pointer through
    ctypes; ``info`` is cleared here too."""
    lines = ["int vk_objs(void** objs, int64_t* info, const volatile int* vk_stop) {",
             f"    void* in[{max(1, n_in)}]; void* out[{max(1, n_out)}];"]
    at = f"*(void**)((char*)objs[{{}}] + {data_offset})"
    for i in range(n_in):
        lines.append(f"    in[{i}] = {at.format(i)};")
    for i in range(n_out):
        lines.append(f"    out[{i}] = {at.format(n_in + i)};")
    k = n_in + n_out
    lines.append(f"    char* scratch = objs[{k}] ? (char*){at.format(k)} : 0;")
    lines.append(f"    for (int k = 0; k < {n_info}; k++) info[k] = 0;")
    lines.append("    return vk_main_body(in, out, info, vk_stop, scratch);")
    lines.append("}")
    return lines


def emit(stmts, lines, ind, simd=False, collapsed=0):
    """Append the C text of ``stmts`` (strings and ``statements`` objects) to ``lines``, indented
    by ``ind``: the one printer of statements, shared by the program and per-sample loop renderers.

    ``simd``: an innermost loop marked parallel (its iterations independent: each stores its
    own elements and reads none another stores) gets :data:`SIMD_LOOP`, so the compiler
    vectorises it without proving its buffers apart -- which it cannot where a read's index is
    no linear function of the loop (a pooling's upsampled gradient, ``g[x / 2]``), and where it
    can, it checks them at run time before every run of the loop.  The loop's arithmetic is
    the same, element by element (no reduction: the same bits).  ``collapsed``: loops of the
    first nest in ``stmts`` that a ``threaded_nests.parallel_for`` line before it collapses."""
    for s in stmts:
        if isinstance(s, str):
            lines.append(ind + s)
            collapsed = collapsed_by(s)
        elif isinstance(s, Loop):
            if simd and not collapsed and _independent_innermost(s):
                lines.append(ind + SIMD_LOOP)
            lines.append(f"{ind}for (int64_t {s.var} = 0; {s.var} < {s.extent}; {s.var}++) {{")
            emit(s.body, lines, ind + "    ", simd, max(0, collapsed - 1))
            lines.append(ind + "}")
            collapsed = 0
        elif isinstance(s, Block):
            lines.append(ind + "{")
            emit(s.body, lines, ind + "    ", simd)
            lines.append(ind + "}")
        elif isinstance(s, If):
            head = f"if ({s.test}) {{" if s.first else (f"{s.test} {{")
            lines.append(ind + head)
            emit(s.body, lines, ind + "    ", simd)
            lines.append(ind + "}")
        elif isinstance(s, While):
            lines.append(f"{ind}while ({s.test}) {{")
            emit(s.body, lines, ind + "    ", simd)
            lines.append(ind + "}")
        else:
            raise TypeError(s)


def _independent_innermost(loop) -> bool:
    """Whether ``loop`` is marked parallel and holds only statements of one line that never
    leave it (no nested loop, no check jumping out: an OpenMP SIMD loop allows neither)."""
    return loop.parallel and all(isinstance(s, str) and not leaves(s) and "#" not in s
                                 for s in loop.body)
