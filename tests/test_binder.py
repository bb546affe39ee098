"""binder/ is exercised, not just written.

mybinder installs ``binder/requirements.txt`` (and ``apt.txt``), then runs ``binder/postBuild`` from
the repository root, and starts the server through ``binder/start``. The second test does the same
on this machine: a fresh virtual environment, the requirements alone, postBuild itself (with the
environment's pip first on PATH, in a copy of the repository), and then a tutorial executed in that
environment through ``binder/start`` (nbclient and its kernel both from it; no ``VKML_BACKEND`` but
what the start script sets) whose outputs must match the stored ones after the same sanitizing
nbval does. It needs the
package index (PyPI or the machine's mirror); with pip's cache warm it takes about 40 s.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from notebook_outputs import assert_same_outputs

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
NOTEBOOK = "02-programs-and-scan.ipynb"

#: What a copy of the repository leaves out: environments, caches and build output.
IGNORED = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist",
                                 ".pytest_cache", ".hypothesis", ".benchmarks", ".ipynb_checkpoints",
                                 ".device-wheels")

def requirement_names(lines):
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def test_binder_requirements_cover_what_postbuild_skips():
    """postBuild installs vkml with --no-deps, so requirements.txt must hold vkml's dependencies
    and its `tutorials` extra: everything the tutorials import (Dask and scikit-learn too)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = project["dependencies"] + extras["jupyter"] + extras["distributed"] + extras["tutorials"]
    needed = {n for n in requirement_names(wanted) if n != "vkml-toolkit"} | {"ipykernel"}
    have = requirement_names((BINDER / "requirements.txt").read_text().splitlines())
    assert needed <= have, f"binder/requirements.txt lacks {sorted(needed - have)}"
    assert "graphviz" in (BINDER / "apt.txt").read_text().split(), "apt.txt must install graphviz (dot)"
    assert os.access(BINDER / "postBuild", os.X_OK), "binder/postBuild must be executable"


def run(cmd, *, env, cwd, timeout):
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr     # (jupyter's listings go to stderr)


def test_binder_recipe_builds_an_environment_that_runs_a_tutorial(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORED)
    env_dir = tmp_path / "binder-env"
    # A fresh environment from the base interpreter: nothing of this test suite's .venv leaks in.
    run([sys.executable, "-m", "venv", str(env_dir)], env=os.environ.copy(), cwd=tmp_path, timeout=300)
    bin_dir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "VKML_BACKEND")}
    env.update(VIRTUAL_ENV=str(env_dir), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("MPLBACKEND", None)
    python = str(bin_dir / "python")

    # 1. what mybinder does: requirements.txt alone, then postBuild from the repository root
    run([python, "-m", "pip", "install", "-q", "-r", str(repo / "binder" / "requirements.txt")],
        env=env, cwd=repo, timeout=1800)
    run(["bash", str(repo / "binder" / "postBuild")], env=env, cwd=repo, timeout=900)

    # 2. vkml comes from the environment (not from the copy's kit/), and JupyterLab has the widgets
    where = run([python, "-c", "import vkml, vkml_jupyter; print(vkml.__file__); "
                 "print(vkml_jupyter.__file__)"], env=env, cwd=tmp_path, timeout=120)
    for line in where.split():
        if line.endswith(".py"):
            assert Path(line).resolve().is_relative_to(env_dir.resolve()), where
    extensions = run([str(bin_dir / "jupyter"), "labextension", "list"], env=env, cwd=tmp_path,
                     timeout=300)
    widgets = [line for line in extensions.splitlines() if "@jupyter-widgets/jupyterlab-manager" in line]
    assert widgets and "enabled" in widgets[0], extensions

    # 3. a tutorial, executed in the environment: nbclient and the kernel are both binder's
    executed = tmp_path / "executed.ipynb"
    runner = textwrap.dedent(f"""
        import nbformat
        from nbclient import NotebookClient
        nb = nbformat.read({str(repo / "notebooks" / NOTEBOOK)!r}, as_version=4)
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={{"metadata": {{"path": {str(repo / "notebooks")!r}}}}}).execute()
        nbformat.write(nb, {str(executed)!r})
    """)
    run(["bash", str(repo / "binder" / "start"), python, "-c", runner], env=env,
        cwd=repo / "notebooks", timeout=900)

    stored = nbformat.read(ROOT / "notebooks" / NOTEBOOK, as_version=4)
    fresh = nbformat.read(executed, as_version=4)
    pairs = assert_same_outputs(stored, fresh, f"{NOTEBOOK} in binder's environment")
    text = "".join(o.get("text", "") for _, c in pairs for o in c.get("outputs", []))
    for seed_line in ("float64 [3] [20, 18, 12]", "float64 [3] [2, 2, 2]", "1 run"):
        assert seed_line in text
