"""Notebook outputs as nbval compares them: the tests that run the tutorials in other environments
(binder's, the lab command's) check them against the stored ones with these."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ROOT / "notebooks" / "nbval_sanitize.cfg"

#: Output keys nbval does not compare: random widget ids, and images (nbval skips PNG/JPEG).
SKIPPED = {"application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"}


def sanitize_patterns():
    """The (regex, replacement) pairs of the sanitize file, read as nbval reads them."""
    return re.findall(r"^regex: (.*)$\n^replace: (.*)$", SANITIZE.read_text(), flags=re.MULTILINE)


def comparable(cell, patterns):
    """A code cell's outputs as nbval compares them: streams joined by name, data by MIME type."""
    out = {}
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            out.setdefault(o["name"], []).append(o["text"])
        elif o["output_type"] == "error":
            out.setdefault("error", []).append(f"{o['ename']}: {o['evalue']}")
        else:
            for mime, value in o.get("data", {}).items():
                if mime not in SKIPPED:
                    out.setdefault(mime, []).append(value if isinstance(value, str) else str(value))
    result = {}
    for key, parts in out.items():
        text = "".join(parts) if key in ("stdout", "stderr") else "\n---\n".join(parts)
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        result[key] = text
    return result


def _ignored(cell) -> bool:
    """A cell whose outputs nbval does not compare: marked NBVAL_IGNORE_OUTPUT or NBVAL_SKIP by a
    comment on its first line or by a cell tag."""
    first = cell.source.split("\n", 1)[0]
    tags = set(cell.get("metadata", {}).get("tags", []))
    return any(m in first or m.lower() in tags or m in tags
               for m in ("NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP"))


def assert_same_outputs(stored, fresh, name, patterns=None):
    """Every code cell of ``fresh`` (a notebook run elsewhere) shows what ``stored`` does."""
    patterns = sanitize_patterns() if patterns is None else patterns
    pairs = [(a, b) for a, b in zip(stored.cells, fresh.cells) if a.cell_type == "code"]
    assert pairs and len(stored.cells) == len(fresh.cells), name
    for i, (want, got) in enumerate(pairs):
        if _ignored(want):
            continue
        assert comparable(got, patterns) == comparable(want, patterns), \
            f"{name}: code cell {i} differs:\n{want.source}"
    return pairs
