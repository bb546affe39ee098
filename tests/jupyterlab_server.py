"""A JupyterLab server for the real-browser tests, started the one way they all need.

A free localhost port and a random token (token auth stays on); config, data, runtime, settings,
workspace and IPython folders in a temporary directory; no announcements, update checks or PyPI
lookups, so nothing touches the network; the NumPy backend.  Stopped with SIGINT (Jupyter's clean
stop, which shuts its kernels down), then killed with its whole session if it hangs.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jupyter_env(home: Path, quiet: bool = True) -> dict:
    """The environment of a Jupyter whose every folder lives under ``home``.  ``quiet=False``
    leaves the news and update settings to the environment's own configuration (what
    ``scripts/dev`` writes into ``.venv``), as a fresh ``scripts/dev lab`` session has them."""
    dirs = {name: home / name
            for name in ("config", "data", "runtime", "settings", "workspaces", "ipython")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    if quiet:
        (dirs["config"] / "jupyter_lab_config.json").write_text(json.dumps({"LabApp": {
            "news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
            "extension_manager": "readonly"}}))
        news = dirs["settings"] / "@jupyterlab" / "apputils-extension"
        news.mkdir(parents=True, exist_ok=True)
        (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    return dict(os.environ, JUPYTER_CONFIG_DIR=str(dirs["config"]),
                JUPYTER_DATA_DIR=str(dirs["data"]), JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
                JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]),
                JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
                IPYTHONDIR=str(dirs["ipython"]), VKML_BACKEND="numpy", JUPYTER_PLATFORM_DIRS="1")


def wait_for_server(url, token, proc, log, deadline):
    # localhost, never through a proxy
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            req = urllib.request.Request(url + "api/status",
                                         headers={"Authorization": f"token {token}"})
            with opener.open(req, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    pytest.fail(f"jupyter lab did not answer in time:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def serving(root: Path, env: dict):
    """JupyterLab serving ``root`` with ``env`` (see :func:`jupyter_env`); yields
    ``{"url", "token", "log"}``."""
    token = os.urandom(24).hex()
    port = free_port()
    args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.token={token}",
            f"--ServerApp.root_dir={root}", "--expose-app-in-browser"]
    if os.geteuid() == 0:  # CI containers run as root; Jupyter refuses root without this
        args.append("--allow-root")
    log = root / "lab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for_server(url, token, proc, log, time.monotonic() + 90)
        yield {"url": url, "token": token, "log": log}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the session this test started: server, kernels
            proc.wait(timeout=10)
