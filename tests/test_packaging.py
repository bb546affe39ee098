"""The wheel is what users get: build it, install it away from the checkout, and use it.

The build runs on a copy of the checkout (without .venv, build/ and other generated folders) so a stale
build/ directory cannot mask a file missing from the package, and the checkout is left untouched.
"""
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATED = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
             ".pytest_cache", ".hypothesis", ".ipynb_checkpoints", ".device-wheels", "node_modules")


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    src = tmp_path_factory.mktemp("src") / "vkml"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*GENERATED))
    out = tmp_path_factory.mktemp("wheelhouse")
    # No build isolation: the test extra installs setuptools and wheel, so no network is needed.
    run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
         "-q", "-w", str(out)], cwd=src)
    wheels = list(out.glob("vkml_toolkit-0.1.0-*.whl"))      # (the distribution vkml-toolkit)
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_holds_every_module_and_the_cuda_templates(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every module of the library, in every subpackage, ships (new subpackages need no config edit).
    for py in (ROOT / "kit" / "vkml").rglob("*.py"):
        rel = py.relative_to(ROOT / "kit").as_posix()
        assert rel in names, f"{rel} is missing from the wheel (a subpackage without __init__.py?)"
    # The CUDA C templates ship inside the package.
    for f in (ROOT / "kernels_cu").iterdir():
        if f.suffix in {".cu", ".cuh", ".h", ".c", ".md", ".py"}:
            assert f"vkml/kernels_cu/{f.name}" in names
    # The Jupyter layer ships beside it as the top-level package vkml_jupyter.
    for py in (ROOT / "extensions" / "vkml_jupyter").rglob("*.py"):
        rel = py.relative_to(ROOT / "extensions").as_posix()
        assert rel in names, f"{rel} is missing from the wheel"
    # Nothing else of the repository leaks into site-packages.
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"vkml", "vkml_jupyter", "vkml_toolkit-0.1.0.dist-info"}, tops


def test_installed_wheel_imports_away_from_checkout_and_runs_seed_example(wheel, tmp_path):
    site = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)])
    code = textwrap.dedent(f"""
        import importlib.resources, pathlib
        import numpy as np
        import vkml
        site = pathlib.Path({str(site)!r}).resolve()
        assert site in pathlib.Path(vkml.__file__).resolve().parents, vkml.__file__
        assert (importlib.resources.files("vkml") / "kernels_cu" / "README.md").is_file()
        assert (importlib.resources.files("vkml.kernels_cu") / "README.md").is_file()

        x = vkml.tensor(np.array([3.0], dtype=np.float32), requires_grad=True)
        vkml.backward(vkml.sum(vkml.mul(x, x)))
        assert x.grad.numpy().tolist() == [6.0], x.grad.numpy()
        print("seed example ok")

        # %load_ext vkml finds the Jupyter layer in the same site-packages
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "vkml")
        magics = ip.magics_manager.magics
        assert "vkml" in magics["cell"] and "vkml" in magics["line"]
        import vkml_jupyter
        assert site in pathlib.Path(vkml_jupyter.__file__).resolve().parents, vkml_jupyter.__file__
        assert site in pathlib.Path(vkml.widgets.__file__).resolve().parents, vkml.widgets.__file__
        print("jupyter layer ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(site), PYTHONNOUSERSITE="1")
    proc = run([sys.executable, "-c", code], cwd=tmp_path, env=env)
    assert "seed example ok" in proc.stdout and "jupyter layer ok" in proc.stdout
