"""ipywidgets explorers: a function's gradient, and a Record's launch and reverse.

:func:`explore_gradient` puts sliders on a function's inputs and scalar
parameters and shows, live, its value, its gradient, a plot of the function
along a chosen direction with its tangent line, and a finite-difference check
of the directional derivative.  All of that is ONE jitted program (value and
gradient by ``vkml.value_and_grad``, the curve by a ``vkml.scan`` over the
points of the line), traced once: each slider move is one cached call and
one submission, which the readout shows.

:func:`explore_record` steps through a Record: its nodes in launch order,
then its reverse sweep, drawing the Record with the current step marked.

Outputs stay deterministic for nbval: readouts are ``HTML`` widgets (never
text printed into an ``Output``), plots are PNG images drawn with
matplotlib's Agg canvas without metadata, and the widgets' text reprs hold
no addresses.
"""

from __future__ import annotations

import html
import io

import ipywidgets as widgets
import numpy as np

import vkml
from vkml import viz
from vkml.errors import ArgumentError
from .static import StaticPicture
from .schedule_explorer import ScheduleExplorer, explore_schedule  # noqa: F401  (budget slider)

from .program_explorer import ProgramExplorer, explore_program  # noqa: E402  (its own module)

__all__ = ["explore_gradient", "explore_record", "explore_program", "explore_schedule",
           "GradientExplorer", "RecordExplorer", "ProgramExplorer", "ScheduleExplorer"]

#: A finite-difference check passes when |fd - exact| <= FD_RTOL * max(1, |exact|).
FD_RTOL = 1e-5


def explore_gradient(f, x0, params=None, *, ranges=None, span=1.0, points=41, eps=1e-5):
    """Sliders for ``f``'s inputs and parameters, with its value, gradient, a plot along a
    direction and a finite-difference check, updated live.

    ``f(x, **params)`` must return a floating scalar Tensor; ``x0`` is a
    number or a 1-D array of a few (at most 16) values, the starting point;
    ``params`` maps names to starting scalar values (each gets a slider, and
    its partial derivative is shown).  ``ranges`` maps a slider's name
    (``"x"`` or ``"x[i]"``, or a parameter's name) to its ``(low, high)``;
    by default a slider spans its start +- ``2 max(1, |start|)``.  The plot shows
    ``t -> f(x + t d)`` for ``t`` in ``[-span, span]`` on ``points`` points,
    with the tangent ``f(x) + t (grad f . d)``; ``eps`` is the
    finite-difference step.

    Returns a :class:`GradientExplorer` (an ipywidgets ``VBox``): display
    it, or drive it from Python through ``explorer.sliders[name].value``.

    >>> def wave(x, k):
    ...     return vkml.sum(vkml.sin(k * x))
    ...
    >>> ex = vkml.widgets.explore_gradient(wave, np.array([0.5, -1.0]), {"k": 1.5})
    >>> round(float(ex.value), 6), ex.fd_ok
    (-0.315856, True)
    >>> sorted(ex.sliders)
    ['k', 'x[0]', 'x[1]']
    """
    return GradientExplorer(f, x0, params, ranges=ranges, span=span, points=points, eps=eps)


#: CSS that follows JupyterLab's theme (``body[data-jp-theme-light]``), not the system's
_PLOT_THEME = ('<style>body[data-jp-theme-light="false"] .vkml-explorer-plot '
               "{ filter: invert(0.92) hue-rotate(180deg); }</style>")


def _slider(name, start, ranges):
    half = 2 * max(1.0, abs(start))
    lo, hi = (ranges or {}).get(name, (start - half, start + half))
    if not lo < hi or not lo <= start <= hi:
        raise ArgumentError(f"explore_gradient: the range of {name} must hold its start {start}, "
                            f"got ({lo}, {hi})")
    return widgets.FloatSlider(value=start, min=lo, max=hi, step=(hi - lo) / 200, description=name,
                               readout_format=".3f", continuous_update=False,
                               layout=widgets.Layout(width="420px"))


class GradientExplorer(StaticPicture, widgets.VBox):
    """The widget :func:`explore_gradient` returns.

    Attributes to read or drive: ``sliders`` (name -> FloatSlider),
    ``direction`` (Dropdown), ``readout`` (HTML), ``plot`` (Image, PNG),
    ``program`` (the jitted function behind every update: its
    ``cache_info()`` shows one trace and a hit per update), and the latest
    ``value``, ``gradient`` (array like x), ``param_gradient`` (name ->
    float), ``slope`` (grad . d), ``finite_difference``, ``submissions``
    (of the latest update) and ``updates``.

    >>> def wave(x, k):
    ...     return vkml.sum(vkml.sin(k * x))
    ...
    >>> ex = vkml.widgets.explore_gradient(wave, np.array([0.5, -1.0]), {"k": 1.5})
    >>> ex.sliders["k"].value = 1.0
    >>> ex.program.cache_info()["traces"], round(float(ex.value), 6)
    (1, -0.362045)
    """

    def __init__(self, f, x0, params=None, *, ranges=None, span=1.0, points=41, eps=1e-5):
        if not callable(f):
            raise ArgumentError(f"explore_gradient: f must be a function, got {type(f).__name__}")
        x0 = np.asarray(x0, dtype=np.float64)
        if x0.ndim > 1 or x0.size > 16 or x0.size == 0:
            raise ArgumentError(f"explore_gradient: x0 must be a number or a 1-D array of 1 to 16 "
                                f"values, got shape {x0.shape}")
        params = dict(params or {})
        for name, v in params.items():
            if not name.isidentifier() or np.ndim(v) != 0:
                raise ArgumentError(f"explore_gradient: params must map names to numbers, got "
                                    f"{name!r}: {v!r}")
        if not (span > 0 and points >= 3 and eps > 0):
            raise ArgumentError("explore_gradient: span and eps must be positive and points >= 3")
        self.f = f
        self._shape = x0.shape
        self._param_names = list(params)
        self.x_names = ["x"] if x0.ndim == 0 else [f"x[{i}]" for i in range(x0.size)]
        self.sliders = {n: _slider(n, float(v), ranges)
                        for n, v in zip(self.x_names, x0.reshape(-1))}
        self.sliders.update({n: _slider(n, float(v), ranges) for n, v in params.items()})
        options = [(f"along {n}", i) for i, n in enumerate(self.x_names)]
        if x0.size > 1:
            options.append(("along the diagonal", -1))
        self.direction = widgets.Dropdown(options=options, value=0, description="plot",
                                          layout=widgets.Layout(width="260px"))
        self.readout = widgets.HTML()
        self.plot = widgets.Image(format="png", layout=widgets.Layout(width="480px"))
        self.plot.add_class("vkml-explorer-plot")
        # the plot is a PNG drawn light; in JupyterLab's dark theme it is shown inverted (hues
        # turned back), so it is not a white block in a dark notebook
        self._theme = widgets.HTML(_PLOT_THEME)
        self._ts = np.concatenate([np.linspace(-span, span, points), [eps, -eps]])
        self._eps = eps
        self.program = vkml.jit(self._explore)
        self.updates = 0
        self.total_submissions = 0
        super().__init__([*self.sliders.values(), self.direction, self.readout, self.plot,
                          self._theme])
        for w in [*self.sliders.values(), self.direction]:
            w.observe(self._on_change, names="value")
        self.update()

    # the ONE program of every update
    def _explore(self, x, p, d, ts):
        def f_of(x, p):
            return self.f(x, **p)

        argnums = (0, 1) if self._param_names else 0
        value, grads = vkml.value_and_grad(f_of, argnums=argnums)(x, p)

        def row(carry, t):
            return carry, f_of(x + t * d, p)

        _, along = vkml.scan(row, np.float64(0.0), ts)
        return value, grads, along

    def _on_change(self, change):
        self.update()

    def _point(self):
        x = np.array([self.sliders[n].value for n in self.x_names], dtype=np.float64)
        x = x.reshape(self._shape)
        p = {n: np.float64(self.sliders[n].value) for n in self._param_names}
        d = np.zeros(max(1, x.size))
        if self.direction.value < 0:
            d[:] = 1.0 / np.sqrt(d.size)
        else:
            d[self.direction.value] = 1.0
        return x, p, d.reshape(self._shape)

    def update(self):
        """Recompute everything at the sliders' values: one call of the cached program.

        >>> def wave(x, k):
        ...     return vkml.sum(vkml.sin(k * x))
        ...
        >>> ex = vkml.widgets.explore_gradient(wave, np.array([0.5, -1.0]), {"k": 1.5})
        >>> ex.update()
        >>> ex.fd_ok
        True
        """
        x, p, d = self._point()
        before = vkml.stats()
        value, grads, along = self.program(x, p, d, self._ts)
        along = along.numpy()
        self.submissions = (vkml.stats() - before).submissions
        self.total_submissions += self.submissions
        self.updates += 1
        gx, gp = grads if self._param_names else (grads, {})
        self.value = float(value.numpy())
        self.gradient = np.array(gx.numpy())
        self.param_gradient = {k: float(v.numpy()) for k, v in sorted(gp.items())}
        self.slope = float(np.sum(self.gradient * d))
        self.finite_difference = float((along[-2] - along[-1]) / (2 * self._eps))
        self._render_readout(x, d)
        self._render_plot(along[:-2])

    @property
    def fd_ok(self) -> bool:
        """Whether the finite difference agrees with the gradient along the plotted direction.

        >>> def wave(x, k):
        ...     return vkml.sum(vkml.sin(k * x))
        ...
        >>> ex = vkml.widgets.explore_gradient(wave, np.array([0.5, -1.0]), {"k": 1.5})
        >>> ex.fd_ok
        True
        """
        return abs(self.finite_difference - self.slope) <= FD_RTOL * max(1.0, abs(self.slope))

    def _direction_name(self):
        return dict((v, k) for k, v in self.direction.options)[self.direction.value]

    def _render_readout(self, x, d):
        def num(v):
            return f"{v:.6g}"

        grad = (num(float(self.gradient)) if self.gradient.ndim == 0
                else "[" + ", ".join(num(g) for g in self.gradient) + "]")
        rows = [f"<b>f(x)</b> = <span class='vkml-value'>{num(self.value)}</span>",
                f"<b>&nabla;<sub>x</sub> f</b> = <span class='vkml-gradient'>{grad}</span>"]
        rows += [f"<b>&part;f/&part;{html.escape(k)}</b> = {num(v)}"
                 for k, v in self.param_gradient.items()]
        mark = "&#10003;" if self.fd_ok else "&#10007; (does not match)"
        along = html.escape(self._direction_name())
        rows.append(f"{along}: &nabla;f&middot;d = {num(self.slope)}, "
                    f"finite difference = {num(self.finite_difference)} "
                    f"(|&Delta;| = {abs(self.finite_difference - self.slope):.1e}) {mark}")
        info = self.program.cache_info()
        n = self.submissions
        rows.append(f"{n} submission{'s' * (n != 1)} for this update; "
                    f"program cache: {info['traces']} trace{'s' * (info['traces'] != 1)}, "
                    f"{info['hits']} hit{'s' * (info['hits'] != 1)}")
        self.readout.value = "<div class='vkml-readout'>" + "<br>".join(rows) + "</div>"

    def _render_plot(self, along):
        # local: matplotlib, an optional dependency, loaded for the first plot
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        ts = self._ts[:-2]
        fig = Figure(figsize=(6, 3.2), dpi=80)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.plot(ts, along, color="#2563eb", label="f(x + t d)")
        ax.plot(ts, self.value + self.slope * ts, color="#dc2626", linestyle="--",
                label="tangent f(x) + t (∇f·d)")
        ax.plot([0.0], [self.value], "o", color="#111827")
        ax.set_xlabel(f"t ({self._direction_name()})")
        ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", metadata={"Software": None})
        self.plot.value = buf.getvalue()

    def static_picture(self):
        """The tangent-line plot as it is now (PNG): what a reader sees without a kernel.

        >>> ex = vkml.widgets.explore_gradient(lambda x: vkml.sum(x * x), np.array([1.0]))
        >>> ex.static_picture()[0]
        'image/png'
        """
        return ("image/png", self.plot.value) if self.plot.value else None

    def __repr__(self):
        at = ", ".join(f"{n}={self.sliders[n].value:.6g}" for n in self.sliders)
        return f"GradientExplorer({getattr(self.f, '__name__', 'f')} at {at})"


def explore_record(record, graph=None):
    """Step through a Record: its nodes in launch order, then its reverse sweep.

    Shows the Record's picture (:func:`vkml.viz.record_dot`) with the
    current step marked, and a readout of the step: the node, the sweep, the
    generation, whether the Record is live or kept, the planes copied before
    an overwrite and their bitwise flags.  With the graph the Record came
    from (``graph``, by default ``record.graph``: anything with ``nodes``
    having ``name``, ``reads`` and ``writes``), the readout also says what
    the node read and wrote.

    Returns a :class:`RecordExplorer` (an ipywidgets ``VBox``); its ``step``
    slider (or the ``prev``/``next`` buttons) moves through the
    ``2 * len(record.nodes)`` steps, numbered from 1 as the readout counts them;
    ``prev`` is disabled on the first step and ``next`` on the last.

    >>> @vkml.kernel
    ... def square(x):
    ...     return {"u": x * x}
    ...
    >>> g = vkml.Graph().add(square.bind(x=np.ones(3), u=np.zeros(3)), name="square").build(record=True)
    >>> g.launch()
    <vkml.Graph: square>
    >>> ex = vkml.widgets.explore_record(g.record, g)
    >>> ex.current
    ('forward', 0, 'square')
    >>> ex.step.value = ex.step.max
    >>> ex.current
    ('reverse', 0, 'square')
    """
    return RecordExplorer(record, graph)


class RecordExplorer(StaticPicture, widgets.VBox):
    """The widget :func:`explore_record` returns (``step``, ``prev``, ``next``, ``readout``,
    ``picture``; ``current`` is the step as ``(sweep, index, node name)``).

    >>> @vkml.kernel
    ... def square(x):
    ...     return {"u": x * x}
    ...
    >>> g = vkml.Graph().add(square.bind(x=np.ones(3), u=np.zeros(3)), name="square").build(record=True)
    >>> g.launch()
    <vkml.Graph: square>
    >>> ex = vkml.widgets.explore_record(g.record)
    >>> ex
    RecordExplorer(generation 1, forward step 0: square)
    """

    def __init__(self, record, graph=None):
        if not viz.is_record(record):
            raise ArgumentError(f"explore_record: expected a Record, got {type(record).__name__}; "
                                "pass graph.record of a Graph built with record=True")
        self.record = record
        self.names = list(record.nodes)
        if not self.names:
            raise ArgumentError("explore_record: this Record holds no nodes")
        graph = graph if graph is not None else getattr(record, "graph", None)
        self._by_name = {n.name: n for n in getattr(graph, "nodes", None) or []}
        n = len(self.names)
        self.step = widgets.IntSlider(value=1, min=1, max=2 * n, description="step",
                                      continuous_update=False)
        self.prev = widgets.Button(description="◀ previous", layout=widgets.Layout(width="120px"))
        self.next = widgets.Button(description="next ▶", layout=widgets.Layout(width="120px"))
        self.readout = widgets.HTML()
        self.picture = widgets.HTML()
        self.prev.on_click(lambda _: self._move(-1))
        self.next.on_click(lambda _: self._move(+1))
        self.step.observe(lambda _: self.update(), names="value")
        buttons = widgets.HBox([self.prev, self.step, self.next])
        super().__init__([buttons, self.readout, self.picture])
        self.update()

    def _move(self, by):
        self.step.value = min(self.step.max, max(self.step.min, self.step.value + by))

    @property
    def current(self):
        """The step shown, as ``(sweep, index, node name)``: sweep ``"forward"`` (launch order) or ``"reverse"``.

        >>> @vkml.kernel
        ... def square(x):
        ...     return {"u": x * x}
        ...
        >>> g = vkml.Graph().add(square.bind(x=np.ones(3), u=np.zeros(3)), name="square").build(record=True)
        >>> g.launch()
        <vkml.Graph: square>
        >>> vkml.widgets.explore_record(g.record).current
        ('forward', 0, 'square')
        """
        n, i = len(self.names), self.step.value - 1
        if i < n:
            return ("forward", i, self.names[i])
        return ("reverse", i - n, self.names[2 * n - 1 - i])

    def update(self):
        """Redraw the picture and the readout for the current step.

        >>> @vkml.kernel
        ... def square(x):
        ...     return {"u": x * x}
        ...
        >>> g = vkml.Graph().add(square.bind(x=np.ones(3), u=np.zeros(3)), name="square").build(record=True)
        >>> g.launch()
        <vkml.Graph: square>
        >>> ex = vkml.widgets.explore_record(g.record)
        >>> ex.update()
        >>> "square" in ex.readout.value
        True
        """
        sweep, i, name = self.current
        r = self.record
        self.prev.disabled = self.step.value <= self.step.min
        self.next.disabled = self.step.value >= self.step.max
        rows = [f"step {self.step.value} of {self.step.max}: "
                f"<b>{'launch' if sweep == 'forward' else 'reverse of'} {html.escape(name)}</b> "
                f"({sweep} sweep, node {i + 1} of {len(self.names)})",
                f"generation {r.generation}; {'live' if getattr(r, 'live', False) else 'released'}"
                f"{', kept' if getattr(r, 'kept', False) else ''}; {r.nbytes} bytes recorded"]
        node = self._by_name.get(name)
        if node is not None:
            rows.append(f"reads {html.escape(', '.join(node.reads) or '-')}; writes "
                        f"{html.escape(', '.join(node.writes) or '-')}")
        bitwise = dict(getattr(r, "bitwise", None) or {})
        flags = {p: " (bitwise)" if b else " (not bitwise)" for p, b in bitwise.items()}
        copied = [p + flags.get(p, "") for p in r.copied]
        rows.append(f"copied before an overwrite: {html.escape(', '.join(copied) or '-')}")
        self.readout.value = "<div class='vkml-readout'>" + "<br>".join(rows) + "</div>"
        picture = viz.record_dot(r, current=(sweep, i))
        bundle = picture._repr_mimebundle_()
        self._svg = bundle.get("image/svg+xml")
        # inline, as a notebook draws a picture: it follows JupyterLab's theme, boxes have titles
        self.picture.value = bundle.get("text/html") or \
            f"<pre>{html.escape(bundle['text/plain'])}</pre>"

    def static_picture(self):
        """The Record's picture at the current step (SVG): what a reader sees without a kernel.

        >>> @vkml.kernel
        ... def square(x):
        ...     return {"u": x * x}
        ...
        >>> g = vkml.Graph().add(square.bind(x=np.ones(3), u=np.zeros(3)), name="square").build(record=True)
        >>> g.launch()
        <vkml.Graph: square>
        >>> vkml.widgets.explore_record(g.record).static_picture()[0]
        'image/svg+xml'
        """
        svg = getattr(self, "_svg", None)
        return ("image/svg+xml", svg) if svg else None

    def __repr__(self):
        sweep, i, name = self.current
        return f"RecordExplorer(generation {self.record.generation}, {sweep} step {i}: {name})"
