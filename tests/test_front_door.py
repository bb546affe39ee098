"""The first five minutes of a new user: the lab command's environment runs every tutorial, the
package name is ours everywhere, the stored tutorials read well without a kernel, and errors and
warnings point at the user's own line.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import traceback
import warnings
from pathlib import Path

import nbformat
import numpy as np
import pytest

import vkml
from notebook_outputs import assert_same_outputs

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
TUTORIALS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
IGNORED = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist",
                                 ".pytest_cache", ".hypothesis", ".benchmarks", ".ipynb_checkpoints",
                                 ".device-wheels", "_build", "screenshots", ".out")


# -- the package's name ------------------------------------------------------------------------------

def _texts():
    """(path, text) of every file a user reads install lines in: README, docs, notebooks (their
    sources and stored outputs), binder, the library's messages, bench, scripts."""
    globs = ["README.md", "CONTRIBUTING.md", "docs/**/*.md", "docs/**/*.rst", "notebooks/*.ipynb",
             "notebooks/*.md", "binder/*", "kit/**/*.py", "extensions/**/*.py", "bench/*.py",
             "bench/*.md", "scripts/*"]
    for pattern in globs:
        for path in ROOT.glob(pattern):
            if path.is_file() and "_build" not in path.parts and "tutorials" not in path.parts:
                yield path, path.read_text(errors="replace")


def test_every_install_line_names_the_distribution_pyproject_declares():
    name = PROJECT["name"]
    from vkml.install import DISTRIBUTION, install_hint
    assert DISTRIBUTION == name and name != "vkml"
    assert install_hint("cuda") == f"pip install '{name}[cuda]'"
    wrong = []
    for path, text in _texts():
        for m in re.finditer(r"pip install\s+['\"]?(vkml[\w.-]*)(\[[\w,]+\])?", text):
            if m.group(1) != name:
                wrong.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
        for m in re.finditer(r"(?<![\w-])vkml\[(\w+)\]", text):
            wrong.append(f"{path.relative_to(ROOT)}: {m.group(0)} (say {name}[{m.group(1)}])")
    assert not wrong, "install lines naming another project:\n" + "\n".join(wrong)
    extras = PROJECT["optional-dependencies"]
    for extra, reqs in extras.items():
        for req in reqs:
            if req.startswith("vkml"):
                assert req.startswith(f"{name}["), f"extra {extra} asks for {req}"


def test_the_name_is_free_on_the_package_index(tmp_path):
    """``pip download vkml-toolkit`` finds nothing that is not this project (skipped without an
    index to ask)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                           str(tmp_path), PROJECT["name"]], capture_output=True, text=True,
                          timeout=300)
    said = proc.stdout + proc.stderr
    if proc.returncode != 0 and "No matching distribution" not in said:
        pytest.skip(f"no package index to ask: {said.strip()[-300:]}")
    assert proc.returncode != 0 and not list(tmp_path.iterdir()), \
        f"the index holds a project called {PROJECT['name']}: choose another name"


# -- the lab command runs every tutorial -------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_lab_commands_environment_runs_every_tutorial(tmp_path):
    """A fresh copy of the repository, set up by the README's lab command alone (``--setup-only``:
    everything but starting JupyterLab), executes every tutorial on the NumPy backend with the
    outputs stored in it -- so the environment the main command makes cannot lack what a
    tutorial imports while the test environment has it."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORED)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "VKML_EAGER", "VKML_THREADS",
                        "MPLBACKEND")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", VKML_PROGRESS="0")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT / ".venv")))
    proc = subprocess.run(["bash", str(repo / "scripts" / "dev"), "lab", "--setup-only"], env=env,
                          cwd=repo, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    python = repo / ".venv" / "bin" / "python"
    runner = textwrap.dedent("""
        import sys, nbformat
        from nbclient import NotebookClient
        source, target = sys.argv[1:]
        nb = nbformat.read(source, as_version=4)
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(__import__("pathlib").Path(source).parent)}}).execute()
        nbformat.write(nb, target)
    """)
    env.update(VIRTUAL_ENV=str(repo / ".venv"), VKML_BACKEND="numpy",
               PATH=f"{repo / '.venv' / 'bin'}{os.pathsep}{env['PATH']}")
    for notebook in TUTORIALS:
        executed = tmp_path / notebook.name
        proc = subprocess.run([str(python), "-c", runner, str(repo / "notebooks" / notebook.name),
                               str(executed)], env=env, cwd=repo / "notebooks", capture_output=True,
                              text=True, timeout=1200)
        assert proc.returncode == 0, f"{notebook.name} fails in the lab's environment:\n" \
                                     f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        assert_same_outputs(nbformat.read(notebook, as_version=4),
                            nbformat.read(executed, as_version=4),
                            f"{notebook.name} in the lab command's environment")


# -- tutorials that read well without a kernel -------------------------------------------------------

@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.name[:2])
def test_a_stored_tutorial_shows_pictures_not_dead_widgets(path):
    nb = nbformat.read(path, as_version=4)
    assert "widgets" not in nb.metadata, "stored widget state: run scripts/refresh_notebooks.py"
    assert "Trust Notebook" in nb.cells[0].source, "the first cell says how to trust the notebook"
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            assert WIDGET_VIEW not in data, \
                f"a dead widget reference in:\n{cell.source[:200]}\n(run scripts/refresh_notebooks.py)"
            if re.search(r"\b(explore_\w+|widgets\.\w+Explorer)\(", cell.source) and \
                    data.get("text/plain", "").startswith(("GradientExplorer", "RecordExplorer",
                                                           "ProgramExplorer", "ScheduleExplorer")):
                assert {"image/png", "image/svg+xml"} & set(data), \
                    f"an explorer with no static picture:\n{cell.source[:200]}"


def test_the_record_explorer_waits_at_its_first_step():
    nb = nbformat.read(ROOT / "notebooks" / "05-gradient-explorer.ipynb", as_version=4)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    stepped = source.index("tour.next.click()")
    assert "tour.step.value = 0" in source[stepped:], "leave the Record explorer at its first step"


def test_the_nbconvert_html_of_the_explorer_tutorial_shows_every_explorer(tmp_path):
    """nbconvert's HTML (what a static page or the docs show) has a picture where each explorer
    was, not blank space."""
    source = ROOT / "notebooks" / "05-gradient-explorer.ipynb"
    shutil.copy(source, tmp_path / source.name)
    proc = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", source.name],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = (tmp_path / source.name.replace(".ipynb", ".html")).read_text()
    nb = nbformat.read(source, as_version=4)
    explorers = sum(1 for c in nb.cells for o in c.get("outputs", [])
                    if o.get("data", {}).get("text/plain", "").endswith(")") and
                    re.match(r"(Gradient|Record|Program|Schedule)Explorer\(", o["data"]["text/plain"]))
    assert explorers >= 3
    pictures = len(re.findall(r'<img [^>]*src="data:image/(?:png|svg\+xml);base64,', page)) + \
        len(re.findall(r"<svg[\s>]", page))
    assert pictures >= explorers + 1, (explorers, pictures)
    assert "application/vnd.jupyter.widget-view+json" not in page


# -- errors and warnings at the user's line ----------------------------------------------------------

def _frames(error):
    return [(f.filename, f.lineno) for f in traceback.extract_tb(error.__traceback__)]


def _vkml_frames(error):
    package = str(Path(vkml.__file__).parent)
    return [f for f in _frames(error) if f[0].startswith(package)]


@pytest.mark.parametrize("call, named", [
    (lambda t: t.numpy(), ".numpy()"), (lambda t: t.item(), ".item()"),
    (lambda t: float(t), "float()"), (lambda t: int(t), "int()"),
    (lambda t: bool(t > 0), "bool()"), (lambda t: t.tolist(), ".numpy()")])
@pytest.mark.parametrize("transform", ["jit", "grad", "vmap"])
def test_a_concrete_value_inside_a_trace_names_the_call_and_the_users_line(call, named, transform,
                                                                          monkeypatch):
    monkeypatch.delenv("VKML_TRACEBACK", raising=False)

    def f(x):
        y = vkml.sum(x * 2.0)
        call(y)                                  # the user's line
        return y

    line = f.__code__.co_firstlineno + 2
    wrapped = {"jit": vkml.jit(f), "grad": vkml.grad(f), "vmap": vkml.vmap(f)}[transform]
    with pytest.raises(vkml.TracingError) as info:
        wrapped(np.ones((3, 2)) if transform == "vmap" else np.ones(2))
    message = str(info.value)
    assert message.startswith(f"{named} of a traced value")
    # (the innermost line of the user's: here the lambda that makes the call)
    assert f"test_front_door.py:{call.__code__.co_firstlineno}" in message
    assert "vkml.jit, grad, vmap or scan" in message
    assert ("vkml.where" in message) if named == "bool()" else ("return it" in message)
    assert not _vkml_frames(info.value), _frames(info.value)
    assert (__file__, line) in _frames(info.value)


def test_vkml_traceback_full_keeps_every_frame(monkeypatch):
    monkeypatch.setenv("VKML_TRACEBACK", "full")
    with pytest.raises(vkml.TracingError) as info:
        vkml.jit(lambda x: x.numpy())(np.ones(2))
    assert len(_vkml_frames(info.value)) >= 3


def test_errors_leaving_a_model_a_launch_and_a_step_show_the_users_frames(monkeypatch):
    monkeypatch.delenv("VKML_TRACEBACK", raising=False)
    model = vkml.nn.Sequential(vkml.nn.Linear(4, 3), vkml.nn.ReLU())
    with pytest.raises(vkml.ShapeError) as info:
        model(np.ones((2, 5), np.float32))
    assert not _vkml_frames(info.value)
    opt = vkml.optim.SGD(model.parameters(), lr=0.1)
    step = opt.compile_step(lambda x: model(x).sum())
    with pytest.raises(vkml.VkmlError) as info:
        step(np.ones((2, 5), np.float32))
    assert not _vkml_frames(info.value)


@pytest.mark.filterwarnings("default::RuntimeWarning")
@pytest.mark.parametrize("make", ["lazy", "jit"])
def test_a_numpy_nan_warning_names_the_op_and_the_users_line(make):
    with vkml.use_backend("numpy"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if make == "lazy":
            line = sys._getframe().f_lineno + 1
            y = vkml.log(vkml.tensor(np.array([-1.0, 2.0]))) * 3
            y.numpy()
        else:
            line = sys._getframe().f_lineno + 1
            f = vkml.jit(lambda a: vkml.sqrt(a) + 1.0)
            f(np.array([-4.0, 4.0]))
    mine = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    op = "log" if make == "lazy" else "sqrt"
    assert str(mine[0].message).startswith(f"{op}: invalid value encountered")
    assert (mine[0].filename, mine[0].lineno) == (__file__, line)


def test_numpy_error_state_and_filters_still_decide():
    with vkml.use_backend("numpy"):
        with warnings.catch_warnings(record=True) as caught, np.errstate(invalid="ignore"):
            warnings.simplefilter("always")
            vkml.jit(lambda a: vkml.log(a) * 2.0)(np.array([-1.0]))
        assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            with pytest.raises(vkml.ExecutionError, match="log: invalid value encountered"):
                vkml.jit(lambda a: vkml.log(a) * 3.0)(np.array([-1.0]))


def test_a_float32_model_fed_float64_says_so_once_with_the_cast():
    from vkml import nn
    nn._WARNED_WIDER.clear()
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        out = model(np.ones((2, 4)))
        model(np.ones((2, 4)))
        model(np.ones((2, 4), np.float32))
    said = [w for w in caught if issubclass(w.category, vkml.VkmlWarning)]
    assert out.dtype == np.float64 and len(said) == 1
    assert "Linear(4, 3): its parameters are float32 but its input is float64" in str(said[0].message)
    assert "x.astype(np.float32)" in str(said[0].message)
    assert (said[0].filename, said[0].lineno) == (__file__, line)
