"""``diff``: two programs drawn side by side with the added, removed and changed boxes marked."""

from __future__ import annotations

import difflib

from .errors import ArgumentError
from .ir import Program
from .printer import fused_view, pp_program
from .programs import Jitted
from .viz_dot import Dot
from .viz_render import Diagram, names_of
from .viz_programs import Marks, draw_program


def _as_program(obj, what):
    if isinstance(obj, Program):
        return obj
    if isinstance(obj, Jitted) and obj.programs():
        return obj.programs()[-1]
    raise ArgumentError(f"diff: {what} must be a Program or a jitted function that has been "
                        f"called, got {type(obj).__name__}; get a Program with "
                        "vkml.program(f, *args)")


def _box_signature(box, names):
    """What a box computes, without the names of its values: two versions of a function that
    compute the same thing the same way have equal signatures."""
    e, kind, text, reads = box
    return (kind, text, tuple(v.type_str() for v in reads), tuple(v.type_str() for v in e.outputs))


def diff(a, b, labels=("before", "after")) -> Diagram:
    """Two programs drawn one above the other with what changed marked.

    ``a`` and ``b`` are Programs or jitted functions (their latest program): two versions of a
    function, or a program and one of its derived programs.  Boxes are matched in order by what
    they compute; a box only in ``a`` is red (removed), only in ``b`` green (added), and a box
    in the same place computing something else yellow (changed).  The text form is a unified
    diff of the printed programs.

    >>> a = vkml.program(lambda x: vkml.sin(x) * 2.0, np.ones(2))
    >>> b = vkml.program(lambda x: vkml.cos(x) * 2.0, np.ones(2))
    >>> vkml.viz.diff(a, b).kind
    'program diff'
    """
    if not (isinstance(labels, (tuple, list)) and len(labels) == 2 and
            all(isinstance(x, str) for x in labels)):
        raise ArgumentError(f"diff: labels must be two strings (the names of a and b), got "
                            f"{labels!r:.80}; for example labels=('before', 'after')")
    pa, pb = _as_program(a, "the first program"), _as_program(b, "the second program")
    na, nb = names_of(pa), names_of(pb)
    boxes_a, boxes_b = fused_view(pa)[1], fused_view(pb)[1]
    sig_a = [_box_signature(x, na) for x in boxes_a]
    sig_b = [_box_signature(x, nb) for x in boxes_b]
    fill_a, fill_b = {}, {}
    counts = {"removed": 0, "added": 0, "changed": 0}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, sig_a, sig_b,
                                                       autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        paired = min(i2 - i1, j2 - j1) if tag == "replace" else 0
        for k in range(i1, i2):
            mark = "changed" if k - i1 < paired else "removed"
            fill_a[id(boxes_a[k][0])] = mark
            counts[mark] += 1
        for k in range(j1, j2):
            mark = "changed" if k - j1 < paired else "added"
            fill_b[id(boxes_b[k][0])] = mark
            counts[mark] += 0 if mark == "changed" else 1
    summary = (f"{counts['added']} added, {counts['removed']} removed, "
               f"{counts['changed']} changed")
    d = Dot(label=f"diff: {summary}", labelloc="t", fontsize="12")
    anchors = []
    for i, (label, prog, names, fills) in enumerate([(labels[0], pa, na, fill_a),
                                                     (labels[1], pb, nb, fill_b)]):
        d.open(f"diff{i}", label, bgcolor="#ffffff")
        anchors.append((draw_program(d, prog, names, f"diff{i}_", Marks(box_fill=fills)),
                        d.last_node))
        d.close()
    if anchors[0][1] is not None and anchors[1][0] is not None:
        d.edge(anchors[0][1], anchors[1][0], style="invis")
    text_a, text_b = pp_program(pa).splitlines(), pp_program(pb).splitlines()
    lines = list(difflib.unified_diff(text_a, text_b, labels[0], labels[1], lineterm="", n=2))
    text = f"diff: {summary}\n" + ("\n".join(lines) if lines else "(the programs print the same)")
    return Diagram("program diff", d.source(), text, d.nodes)
