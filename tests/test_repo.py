"""The repository's entry points: the README's two commands, CI, binder and the packaging metadata."""
import os
import re
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extra installs tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT / "scripts" / "dev"


def code_lines(path):
    """The lines of a shell script that are not comments or blank."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_readme_quick_start_names_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", quick, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["scripts/dev lab", "scripts/dev test"]


def test_ci_runs_the_test_command():
    assert any(re.search(r"\bscripts/dev test\b", line) for line in code_lines(ROOT / ".ci" / "run"))
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


def test_dev_script_is_executable_valid_bash_with_the_three_commands():
    assert os.access(DEV, os.X_OK)
    subprocess.run(["bash", "-n", str(DEV)], check=True)
    # An unknown command prints the usage and sets nothing up.
    proc = subprocess.run([str(DEV), "no-such-command"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    for sub in ("lab", "test", "bench"):
        assert f"scripts/dev {sub}" in proc.stderr


def test_lab_keeps_token_auth_and_localhost():
    code = "\n".join(code_lines(DEV))
    assert "--ip=127.0.0.1" in code
    assert "0.0.0.0" not in code
    assert not re.search(r"token\s*=\s*(''|\"\"|$)", code, re.M), "Jupyter's token must stay on"
    # --allow-root is added only under `id -u` == 0 (CI containers run as root).
    assert re.search(r'if \[ "\$\(id -u\)" -eq 0 \]; then\s+args\+=\(--allow-root\)', code)


def test_binder_installs_graphviz_and_vkml():
    assert "graphviz" in (ROOT / "binder" / "apt.txt").read_text().split()
    post = ROOT / "binder" / "postBuild"
    assert os.access(post, os.X_OK)
    assert any(re.search(r"pip install .*(\s\.$|-e \.)", line) for line in code_lines(post))
    text = (ROOT / "binder" / "requirements.txt").read_text()
    lines = (line.split("#")[0].strip() for line in text.splitlines())
    reqs = {re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0] for line in lines if line}
    assert {"numpy", "jupyterlab", "ipywidgets", "graphviz"} <= reqs


def test_pyproject_core_depends_on_numpy_only_and_pins_torch():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["name"] == "vkml-toolkit"     # the index's "vkml" is another project
    assert project["dependencies"] == ["numpy>=1.24"]
    extras = project["optional-dependencies"]
    assert "torch==2.13.0" in extras["bench"]  # a newer torch pulls a multi-GB CUDA build
    assert "vkml-toolkit[tutorials]" in extras["test"]
    pytest_options = meta["tool"]["pytest"]["ini_options"]
    assert set(pytest_options["testpaths"]) == {"tests", "notebooks"}
    assert "--nbval" in pytest_options["addopts"].split()   # the tutorials run as tests too


def test_the_readme_tour_runs():
    """Every ```python block of the README runs as written (a newcomer's first try)."""
    import re
    import numpy as np
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    ns = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), ns)
    np.testing.assert_allclose(ns["grads"]["k"], np.sum(np.cos(1.5 * ns["x"] ** 2) * ns["x"] ** 2))
