"""The ``%%vkml`` cell magic and the ``%vkml`` line magic.

``%%vkml`` runs its cell in the notebook's namespace under a chosen mode and
backend and then shows what the cell built.  It splits the cell into its
body and its last expression (as IPython does), so it can draw the lazy
graph of that expression BEFORE anything realizes it; then it realizes the
expression's tensors on the cell's backend, shows the rest, and gives the
value back as the cell's result.  Eager mode and the backend are put back
afterwards, also when the cell raises.  Bad arguments print :data:`USAGE`
and run nothing.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import re
import shlex
import time

from IPython.core.displayhook import DisplayHook
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

import vkml
from vkml import viz
from vkml.programs.jitted import live_jitted
from vkml.pytree import flatten
from vkml.runtime import is_traced

USAGE = """\
usage: %%vkml [--eager] [--backend NAME] [--show WHAT[,WHAT...]] [--grad VAR] [--time]
       %vkml info | eager on|off | backend NAME

%%vkml runs the cell in the notebook's namespace and shows what vkml built:
  --eager          run the cell in eager mode (every op runs at once; an error names its op)
  --backend NAME   run the cell on backend NAME (see %vkml info for those available)
  --show WHAT      draw what the cell built; WHAT is one or more of (comma-separated):
                     graph       the last expression's pending lazy graph, before it is
                                 realized (or a vkml.Graph's nodes and planes)
                     program     the traced Program of the last expression (a jitted
                                 function, vkml.grad(f), or a Program from vkml.program)
                                 and of every jitted function the cell called
                     derivative  those functions' derived programs under their primal
                     record      a Graph's latest Record (or a Record): the last
                                 expression's, or any the cell made
                     stats       submissions, compiles, cache hits, traces and wall time
  --grad VAR       after the cell, show VAR.grad (may be given more than once)
  --time           show the cell's wall time
The last expression's tensors are realized on the cell's backend before the cell ends.
Eager mode and the backend are restored afterwards, also when the cell raises; other threads
never see the cell's --backend or --eager.

%vkml info            backend, device, eager mode, cached executables, counters
%vkml eager on|off    turn eager mode on or off for the following cells
%vkml backend NAME    run the following cells on backend NAME"""

SHOW = ("graph", "program", "derivative", "record", "stats")

_DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


class BadArguments(Exception):
    """Arguments of a magic that do not parse: the message says which and why."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print to stderr and exit
        raise BadArguments(message)


def _cell_parser():
    p = _Parser(prog="%%vkml", add_help=False, allow_abbrev=False)
    p.add_argument("--eager", action="store_true")
    p.add_argument("--backend", metavar="NAME")
    p.add_argument("--show", metavar="WHAT", action="append", default=[])
    p.add_argument("--grad", metavar="VAR", action="append", default=[])
    p.add_argument("--time", action="store_true")
    p.add_argument("-h", "--help", action="store_true")
    return p


def parse_cell_args(line: str) -> argparse.Namespace:
    """The options of a ``%%vkml`` line, checked; raises :class:`BadArguments`."""
    try:
        words = shlex.split(line)
    except ValueError as err:
        raise BadArguments(f"cannot split the arguments: {err}") from None
    opts = _cell_parser().parse_args(words)
    shows = []
    for item in opts.show:
        for what in item.split(","):
            what = what.strip()
            if what not in SHOW:
                raise BadArguments(f"--show: unknown {what!r}; choose from {', '.join(SHOW)}")
            if what not in shows:
                shows.append(what)
    opts.show = shows
    for name in opts.grad:
        if not _DOTTED_NAME.match(name):
            raise BadArguments(f"--grad: {name!r} is not a variable name")
    if opts.backend is not None:
        _check_backend(opts.backend)
    return opts


def _check_backend(name):
    info = vkml.backend_info()
    available = info["available"]
    why = info.get("unavailable", {}).get(name)
    if why is not None:
        raise BadArguments(f"backend {name!r} cannot run here: {why}; available: "
                           f"{', '.join(available)}")
    if name not in available:
        raise BadArguments(f"unknown backend {name!r}; available: {', '.join(available)}")


def _plural(n, word):
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


def counts_text(delta) -> str:
    """``"1 submission, 1 compile, 0 cache hits, 1 trace, 0 derivations"`` for a Stats diff."""
    return ", ".join([_plural(delta.submissions, "submission"), _plural(delta.compiles, "compile"),
                      _plural(delta.cache_hits, "cache hit"), _plural(delta.traces, "trace"),
                      _plural(delta.derivations, "derivation")])


class CellStats:
    """What one ``%%vkml`` cell cost: the counters' difference and its wall time."""

    def __init__(self, delta, seconds: float):
        self.delta = delta
        self.seconds = seconds

    def __repr__(self):
        return f"vkml: {counts_text(self.delta)}; wall time {self.seconds * 1e3:.1f} ms"

    def _repr_mimebundle_(self, include=None, exclude=None):
        rows = "".join(f"<tr><td>{k}</td><td>{getattr(self.delta, k)}</td></tr>"
                       for k in ("submissions", "compiles", "cache_hits", "traces", "derivations"))
        html = (f'<table class="vkml-stats"><tr><th>cell</th><th>count</th></tr>{rows}'
                f"<tr><td>wall time</td><td>{self.seconds * 1e3:.1f} ms</td></tr></table>")
        return {"text/plain": repr(self), "text/html": html}


def _note(text):
    print(f"vkml: {text}")


def _kind(value) -> str:
    return "nothing" if value is None else f"a {type(value).__name__}"


def _last(value, has_value) -> str:
    return _kind(value) if has_value else "missing"


def _tensors_in(value):
    """The Tensors of a Tensor or a tuple/list/dict of them (None if it holds anything else)."""
    if not isinstance(value, (vkml.Tensor, tuple, list, dict)):
        return None
    leaves, _ = flatten(value)
    if leaves and all(isinstance(t, vkml.Tensor) for t in leaves):
        return leaves
    return None


def _jitted_of(value):
    if isinstance(value, vkml.Jitted):
        return value
    inner = getattr(value, "jitted", None)  # vkml.grad(f) and value_and_grad(f) carry theirs
    return inner if isinstance(inner, vkml.Jitted) else None


def _ends_with_semicolon(cell) -> bool:
    """A cell ending in ``;`` shows no result, as in any IPython cell."""
    try:
        return DisplayHook.semicolon_at_end_of_expression(cell)
    except Exception:  # tokenize errors on IPython-only syntax: then it is not a plain ';'
        return False


def _jit_counters() -> dict:
    """id -> (jitted function, its counters), for every function vkml.jit has made."""
    out = {}
    for j in live_jitted():
        module = getattr(j.fn, "__module__", None)   # None for a function made by eval or exec
        if isinstance(module, str) and module.startswith("vkml."):
            continue  # the library's own helpers are not what the user called
        out[id(j)] = (j, (j.traces, j.hits, j.derivations))
    return out


def _ran_between(before, after):
    """The jitted functions whose counters moved between two :func:`_jit_counters`."""
    return [j for key, (j, counts) in after.items()
            if key not in before or before[key][1] != counts]


def _records_in(ns) -> dict:
    """id -> Record for the Records in a namespace (as values, or as a Graph's ``record``)."""
    found = {}
    for name, value in list(ns.items()):
        if name.startswith("_"):
            continue
        rec = value if viz.is_record(value) else getattr(value, "record", None) \
            if viz.is_graph(value) else None
        if rec is not None and viz.is_record(rec):
            found[id(rec)] = rec
    return found


def _is_picture(value) -> bool:
    """Whether a cell's last value is what ``--show`` draws (then the drawing replaces its repr)."""
    return (isinstance(value, vkml.Program) or _jitted_of(value) is not None
            or viz.is_graph(value) or viz.is_record(value))


def _traced(t) -> bool:
    return is_traced(t.ir_var)


def help_without_a_body(lines):
    """IPython refuses a cell magic whose cell has nothing under its first line before the magic
    sees it ("the cell body is empty"), so ``%%vkml --help`` alone in a cell -- what a reader
    types to see the options -- is run as the line magic ``%vkml --help``, which prints them.
    (An input transformer: lines in, lines out; anything else passes unchanged.)

    >>> help_without_a_body(["%%vkml --help\n"])
    ['%vkml --help\n']
    >>> help_without_a_body(["%%vkml --eager\n", "y = 1\n"])
    ['%%vkml --eager\n', 'y = 1\n']
    """
    if lines and lines[0].lstrip().startswith("%%vkml") and not "".join(lines[1:]).strip():
        words = lines[0].split()
        if "--help" in words or "-h" in words:
            return [lines[0].replace("%%vkml", "%vkml", 1)] + lines[1:]
    return lines


@magics_class
class VkmlMagics(Magics):
    """``%%vkml`` and ``%vkml`` (see :data:`USAGE`).

    >>> from IPython.core.interactiveshell import InteractiveShell
    >>> ip = InteractiveShell()    # a shell of its own (a notebook has one already)
    >>> _ = ip.extension_manager.load_extension("vkml")
    >>> ip.user_ns["vkml"] = vkml
    >>> ip.run_cell("%%vkml --eager --show stats\\ny = vkml.tensor([1.0, 2.0]) * 3").success
    vkml: 1 submission, ... wall time ... ms
    True
    >>> ip.user_ns["y"]
    tensor([3., 6.], dtype=float64)
    """

    @line_cell_magic
    def vkml(self, line, cell=None):
        if cell is None:
            return self._line(line)
        return self._cell(line, cell)

    vkml.__doc__ = USAGE

    # -- %%vkml ------------------------------------------------------------------------------
    def _cell(self, line, cell):
        try:
            opts = parse_cell_args(line)
        except BadArguments as err:
            print(f"%%vkml: {err}\n\n{USAGE}")
            return None
        if opts.help:
            print(USAGE)
            return None
        # The cell's --backend and --eager are scoped to this cell (context-local, like
        # ``with vkml.use_backend(...)``), so other threads and tasks never see them; global
        # switches the cell itself makes (set_backend, set_eager) are put back when it ends,
        # also when it raises.
        old_eager, old_backend = vkml.is_eager(), vkml.backend_info()["backend"]
        with contextlib.ExitStack() as modes:
            modes.callback(vkml.set_backend, old_backend)
            modes.callback(vkml.set_eager, old_eager)
            if opts.backend is not None:
                modes.enter_context(vkml.use_backend(opts.backend))
            if opts.eager:
                modes.enter_context(vkml.eager(True))
            jit_before, records_before = _jit_counters(), _records_in(self.shell.user_ns)
            before, start = vkml.stats(), time.perf_counter()
            value, has_value = self._run(cell, opts)
            tensors = _tensors_in(value) if has_value else None
            if tensors:
                vkml.realize([t for t in tensors if not _traced(t)])
            seconds = time.perf_counter() - start
            delta = vkml.stats() - before
            ran = _ran_between(jit_before, _jit_counters())
            made = [r for k, r in _records_in(self.shell.user_ns).items()
                    if k not in records_before]
            drawn = "graph" in opts.show and has_value and tensors is None and viz.is_graph(value)
            if "program" in opts.show:
                drawn |= self._show_program(value, has_value, ran)
            if "derivative" in opts.show:
                drawn |= self._show_derivative(value, has_value, ran)
            if "record" in opts.show:
                drawn |= self._show_record(value, has_value, made)
            for name in opts.grad:
                self._show_grad(name)
            if "stats" in opts.show:
                display(CellStats(delta, seconds))
            elif opts.time:
                print(f"vkml: wall time {seconds * 1e3:.1f} ms")
        pictured = has_value and tensors is None and _is_picture(value)
        if not has_value or (drawn and pictured) or _ends_with_semicolon(cell):
            return None
        return value

    def _run(self, cell, opts):
        """Run the cell's body, evaluate its last expression (not realized); draw it for
        ``--show graph``.  Returns ``(value, has_value)``."""
        shell = self.shell
        code = shell.transform_cell(cell)  # IPython syntax (%magics, !commands) to Python
        tree = ast.parse(code)
        filename = shell.compile.cache(code, shell.execution_count, raw_code=cell)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        flags = shell.compile.flags
        exec(compile(tree, filename, "exec", flags=flags, dont_inherit=True),
             shell.user_global_ns, shell.user_ns)
        if last is None:
            if "graph" in opts.show:
                _note("--show graph: the cell has no last expression to draw")
            return None, False
        value = eval(compile(ast.Expression(last.value), filename, "eval", flags=flags,
                             dont_inherit=True), shell.user_global_ns, shell.user_ns)
        if "graph" in opts.show:
            if _tensors_in(value):
                display(viz.tensor_dot(value))
            elif viz.is_graph(value):
                display(viz.graph_dot(value))
            else:
                _note(f"--show graph: the last expression is {_kind(value)}, not a Tensor "
                      "or a Graph")
        return value, True

    def _show_program(self, value, has_value, ran=()) -> bool:
        """The last expression's program, then those of the jitted functions the cell called."""
        shown = False
        if isinstance(value, vkml.Program):
            display(viz.program_dot(value))
            shown = True
        jitted = _jitted_of(value)
        others = [j for j in ran if j is not jitted and j.programs()
                  and not (isinstance(value, vkml.Program) and value in j.programs())]
        if jitted is not None:
            if jitted.programs():
                display(viz.program_dot(jitted.programs()[-1], arg_names=viz.parameter_names(jitted)))
                shown = True
            elif not others:
                _note(f"--show program: {jitted.__name__} has not been called yet; call it in "
                      "the cell (its program is traced on the first call)")
                return False
        for j in others:
            display(viz.program_dot(j.programs()[-1], arg_names=viz.parameter_names(j)))
            shown = True
        if not shown:
            _note(f"--show program: the last expression is {_last(value, has_value)} and the "
                  "cell called no jitted function; end the cell with a jitted function "
                  "(vkml.jit(f)) or vkml.program(f, *args), or call one in the cell")
        return shown

    def _show_derivative(self, value, has_value, ran=()) -> bool:
        """The derived programs of the last expression's function and of those the cell called."""
        jitted = _jitted_of(value)
        candidates = ([jitted] if jitted is not None else []) + [j for j in ran if j is not jitted]
        with_derivatives = [j for j in candidates if viz.derived_pairs(j)]
        for j in with_derivatives:
            display(viz.derived_dot(j))
        if with_derivatives:
            return True
        if jitted is not None:
            _note(f"--show derivative: {jitted.__name__} has no derived programs yet; take a "
                  "derivative in the cell (vkml.grad(f)(x), vkml.jvp, vkml.vjp or vkml.linearize)")
        elif ran:
            _note(f"--show derivative: the cell called {', '.join(j.__name__ for j in ran)} but "
                  "took no derivative; call vkml.grad(f)(x), vkml.jvp, vkml.vjp or "
                  "vkml.linearize in the cell")
        else:
            _note(f"--show derivative: the last expression is {_last(value, has_value)}; "
                  "end the cell with the jitted function whose derivative it took, or take "
                  "one in the cell")
        return False

    def _show_record(self, value, has_value, made=()) -> bool:
        if viz.is_record(value):
            display(viz.record_dot(value))
            return True
        if has_value and hasattr(value, "record") and viz.is_graph(value):
            if value.record is None:
                _note("--show record: this Graph has no Record yet; build it with "
                      "build(record=True) and launch() it")
                return False
            display(viz.record_dot(value.record))
            return True
        for rec in made:
            display(viz.record_dot(rec))
        if made:
            return True
        _note(f"--show record: the last expression is {_last(value, has_value)} and the cell "
              "made no Record; end the cell with a Graph built with record=True, or a Record")
        return False

    def _show_grad(self, name):
        obj = self.shell.user_ns
        parts = name.split(".")
        try:
            obj = obj[parts[0]]
            for p in parts[1:]:
                obj = getattr(obj, p)
        except (KeyError, AttributeError):
            _note(f"--grad {name}: no such variable")
            return
        grad = getattr(obj, "grad", None)
        if grad is None:
            _note(f"--grad {name}: {name}.grad is None (nothing has reached it yet: call "
                  "backward on a value computed from it)")
            return
        display({"text/plain": f"{name}.grad = {grad!r}"}, raw=True)

    # -- %vkml -------------------------------------------------------------------------------
    def _line(self, line):
        try:
            words = shlex.split(line)
        except ValueError as err:
            print(f"%vkml: cannot split the arguments: {err}\n\n{USAGE}")
            return
        if not words or words in (["help"], ["-h"], ["--help"]):
            print(USAGE)
        elif words == ["info"]:
            print(info_text())
        elif words[0] == "eager" and len(words) == 2 and words[1] in ("on", "off"):
            vkml.set_eager(words[1] == "on")
            print(f"vkml: eager mode {words[1]}")
        elif words == ["eager"]:
            print(f"vkml: eager mode {'on' if vkml.is_eager() else 'off'}")
        elif words[0] == "backend" and len(words) == 2:
            try:
                _check_backend(words[1])
            except BadArguments as err:
                print(f"%vkml: {err}\n\n{USAGE}")
                return
            vkml.set_backend(words[1])
            info = vkml.backend_info()
            print(f"vkml: backend {info['backend']} (device {info['device']})")
        elif words == ["backend"]:
            info = vkml.backend_info()
            print(f"vkml: backend {info['backend']} (device {info['device']})")
        else:
            print(f"%vkml: unknown command {line.strip()!r}\n\n{USAGE}")


def info_text() -> str:
    """What ``%vkml info`` prints: backend, device, eager mode, caches, counters, diagrams."""
    info = dict(vkml.backend_info())
    name, device = info.pop("backend"), info.pop("device")
    available = info.pop("available", [])
    unavailable = info.pop("unavailable", {})
    lines = [f"vkml {vkml.__version__}",
             f"backend: {name} (device {device}); available: {', '.join(available)}",
             *(f"not available here: {k} ({why})" for k, why in unavailable.items()),
             f"eager mode: {'on' if vkml.is_eager() else 'off'}"]
    lines += [f"{k}: {v}" for k, v in info.items()]
    lines.append(f"counters since the last reset: {counts_text(vkml.stats())}")
    sizes = ", ".join(f"{name} {n}" for name, n in vkml.stats().caches.items()) or "empty"
    lines.append(f"caches (at most {vkml.cache_limit()} entries each): {sizes}")
    hint = viz.dot_available()
    lines.append("diagrams: graphviz dot found" if hint is None else f"diagrams: off {hint}")
    return "\n".join(lines)
