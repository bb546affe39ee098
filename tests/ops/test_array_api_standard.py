"""The Python array API standard's own test suite, run against ``vkml.numpy``.

The suite (data-apis/array-api-tests) is vendored unchanged beside the project, in
``../shared/array-api-tests``; it is run here in a subprocess, as its README says, at a small
number of examples per test (CI's budget), and must pass at least 97% of what it runs, with no
xfails file.  Tests it cannot pass today, and why (the closing notes list them):
- ``__setitem__``: vkml tensors are values, never written in place (``assign_``/``where``);
- decompositions and solves of complex matrices, complex ``expm1`` at infinities (NumPy's);
- the mean/var/std of no elements, refused with a ShapeError where the standard asks for NaN.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = [ROOT.parent / "shared" / "array-api-tests", Path("/work/shared/array-api-tests")]
SUITE = next((p for p in CANDIDATES if (p / "array_api_tests").is_dir()), None)

#: examples per test in CI (the closing note gives the result at 20)
EXAMPLES = int(os.environ.get("VKML_ARRAY_API_EXAMPLES", "3"))
PASS_RATE = 0.97


@pytest.mark.skipif(SUITE is None, reason="the vendored array API test suite is not beside the project")
def test_the_array_api_standards_suite_passes(tmp_path):
    pytest.importorskip("ndindex", reason="in the test extra (scripts/dev test installs it)")
    pytest.importorskip("pytest_jsonreport", reason="in the test extra (scripts/dev test installs it)")
    report = tmp_path / "report.json"
    env = dict(os.environ, ARRAY_API_TESTS_MODULE="vkml.numpy", ARRAY_API_TESTS_VERSION="2023.12",
               VKML_BACKEND="numpy",
               PYTHONPATH=os.pathsep.join([str(ROOT / "kit"), str(ROOT / "extensions")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "array_api_tests", "-q", "-p", "no:cacheprovider",
         "-p", "no:randomly", "--max-examples", str(EXAMPLES), "--json-report",
         f"--json-report-file={report}", "-o", "addopts="],
        cwd=SUITE, env=env, capture_output=True, text=True, timeout=1500)
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(report.read_text())["summary"]
    passed, failed = summary.get("passed", 0), summary.get("failed", 0) + summary.get("error", 0)
    rate = passed / max(1, passed + failed)
    failures = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    assert passed > 1000, f"the suite ran too little: {summary}"
    assert rate >= PASS_RATE, (f"{rate:.1%} of the array API suite passes ({passed} passed, "
                               f"{failed} failed):\n" + "\n".join(failures[:60]))
