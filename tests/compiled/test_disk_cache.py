"""The compiled-code cache loads only what this user built.

Each test uses its own ``VKML_CACHE_DIR``.  The cache folder must be ours (else a private temporary
one is used, with one warning); anything in an entry's place that does not check out -- a
directory, a FIFO, a symlink, a sidecar that does not parse, a wrong hash, a library that fails
to load, the entry of another program -- is rebuilt and the result is right; concurrent builders
and a process swapping entries never make anyone run the wrong code.  Cases that could hang or
crash run in a child process with a timeout.
"""

import ctypes
import itertools
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import vkml
from vkml.backends import cpu, disk_cache

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="no C compiler")

#: a tiny library whose one function says which program it is
SOURCE = "double vk_value(void) {{ return {value!r}; }}\n"

CHILD = textwrap.dedent("""
    import ctypes, json, sys, warnings
    warnings.simplefilter("always")
    import vkml
    from vkml.backends import cpu
    SOURCE = {source!r}
    results = []
    for value in sys.argv[1:]:
        lib, compiled = cpu.library(SOURCE.format(value=float(value)))
        fn = lib.vk_value
        fn.restype = ctypes.c_double
        results.append([fn(), compiled])
    print(json.dumps({{"results": results, "compiles": vkml.stats().compiles}}))
""").format(source=SOURCE)

WARNING = "not using the compiled-code cache"


def child_env(cache=None, **extra):
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env.pop("VKML_CACHE_DIR", None)
    env.pop("XDG_CACHE_HOME", None)
    if cache is not None:
        env["VKML_CACHE_DIR"] = str(cache)
    return env


def run_child(env, *values, timeout=60):
    """``(results, compiles, stderr)`` of a child loading the libraries of ``values``."""
    proc = subprocess.run([sys.executable, "-c", CHILD, *map(str, values)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["results"], out["compiles"], proc.stderr


def value_of(value):
    """``(value the loaded library returns, compiled)`` for the library of ``value``, in-process."""
    lib, compiled = cpu.library(SOURCE.format(value=float(value)))
    fn = lib.vk_value
    fn.restype = ctypes.c_double
    return fn(), compiled


def new_entry(folder, value):
    """Build the library of ``value`` and return the path of its entry (the one file that appeared)."""
    before = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    value_of(value)
    added = [n for n in set(os.listdir(folder)) - before if n.endswith(".so")]
    assert len(added) == 1, added
    return os.path.join(folder, added[0])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# -- a good cache ------------------------------------------------------------------------------------

def test_a_fresh_cache_is_private_and_its_sidecar_binds_key_and_content(cache):
    vkml.reset_stats()
    assert value_of(1.5) == (1.5, True)
    assert value_of(1.5) == (1.5, False)                     # from the disk
    assert vkml.stats().compiles == 1                        # counts compiler runs only
    folder = cache / "cpu"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    (so,) = folder.glob("vk_*.so")
    key = so.name[len("vk_"):-len(".so")]
    side = (folder / (so.name + ".sha256")).read_text()
    assert side == disk_cache.sidecar_text(key, so.read_bytes())
    assert side != disk_cache.sidecar_text("0" * len(key), so.read_bytes())
    assert sorted(p.name for p in folder.iterdir()) == [so.name, so.name + ".sha256"]  # no leftovers


# -- the folder ----------------------------------------------------------------------------------------

#: values not built before in this process (the private fallback cache lives as long as it does)
FRESH = itertools.count(1000)


def _refused(monkeypatch, cache_path, untouched, shown=None):
    """The library still works, with one warning naming ``shown`` (default ``cache_path``), and
    nothing lands in ``untouched``."""
    monkeypatch.setenv("VKML_CACHE_DIR", str(cache_path))
    before = sorted(os.listdir(untouched))
    one, two = next(FRESH), next(FRESH)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert value_of(one) == (one, True)
        assert value_of(one) == (one, False)                 # the private cache serves this process
        assert value_of(two) == (two, True)
    msgs = [str(x.message) for x in w if WARNING in str(x.message)]
    assert len(msgs) == 1 and str(shown or cache_path) in msgs[0], msgs
    assert sorted(os.listdir(untouched)) == before
    return msgs[0]


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@needs_root
def test_a_cache_folder_of_another_user_is_not_used_even_by_root(tmp_path, monkeypatch):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    msg = _refused(monkeypatch, d, d)
    assert "65534" in msg and "VKML_CACHE_DIR" in msg
    assert oct(d.stat().st_mode & 0o777) == "0o700" and d.stat().st_uid == 65534   # not chmod-ed


@needs_root
def test_a_kind_folder_of_another_user_is_not_used(tmp_path, monkeypatch):
    d = tmp_path / "mine"
    (d / "cpu").mkdir(parents=True, mode=0o700)
    os.chmod(d, 0o700)
    os.chown(d / "cpu", 65534, 65534)
    _refused(monkeypatch, d, d / "cpu", shown=d / "cpu")


@needs_root
def test_a_folder_above_the_cache_that_another_user_owns_is_refused(tmp_path, monkeypatch):
    parent = tmp_path / "their-parent"
    parent.mkdir(mode=0o755)
    (parent / "cache").mkdir(mode=0o700)
    os.chown(parent, 65534, 65534)                           # they could rename our folder away
    msg = _refused(monkeypatch, parent / "cache", parent / "cache", shown=parent)
    assert "above the cache folder" in msg


def test_a_symlink_in_place_of_the_cache_folder_is_not_followed(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    msg = _refused(monkeypatch, tmp_path / "link", real)
    assert "symlink" in msg


def test_a_symlink_in_place_of_the_kind_folder_is_not_followed(tmp_path, monkeypatch):
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    (base / "cpu").symlink_to(real)
    monkeypatch.setenv("VKML_CACHE_DIR", str(base))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        v = next(FRESH)
        assert value_of(v) == (v, True)
    assert any(str(base / "cpu") in str(x.message) for x in w)
    assert os.listdir(real) == []


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_folder_others_can_write_is_not_used(tmp_path, monkeypatch, mode):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, mode)
    msg = _refused(monkeypatch, d, d)
    assert "chmod 700" in msg


@pytest.mark.parametrize("home", ["", "relative/home", "/dev/null", "/proc/vkml-no-such-home"])
def test_an_empty_or_unwritable_home_works_with_one_warning(tmp_path, home):
    env = child_env(HOME=home)
    results, compiles, err = run_child(env, 1.25, 1.25, 7.0)
    assert results == [[1.25, True], [1.25, False], [7.0, True]] and compiles == 2
    assert err.count(WARNING) == 1, err


def test_a_cache_path_that_is_a_file_works_with_one_warning(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("not a folder")
    results, compiles, err = run_child(child_env(f), 0.5)
    assert results == [[0.5, True]] and err.count(WARNING) == 1 and str(f) in err
    assert f.read_text() == "not a folder"


def test_a_cache_that_cannot_be_written_costs_only_a_recompile(cache, monkeypatch):
    def full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(disk_cache, "_write_file", full)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert value_of(9.0) == (9.0, True)
        assert value_of(9.0) == (9.0, True)
    assert sum("could not store" in str(x.message) for x in w) == 1


def test_a_library_that_cannot_be_loaded_even_fresh_is_a_backend_error(cache, monkeypatch):
    def noexec(data, folder, loader):
        raise OSError("failed to map segment from shared object")
    value_of(11.0)                                           # a good cached entry, then loads fail
    monkeypatch.setattr(disk_cache, "load_private_copy", noexec)
    vkml.reset_stats()
    with pytest.raises(vkml.BackendError, match="VKML_CACHE_DIR"):
        value_of(11.0)
    assert vkml.stats().compiles == 1                        # the cached one failed: rebuilt once


# -- an entry ------------------------------------------------------------------------------------------

def _put_directory(path):
    os.remove(path)
    os.mkdir(path)
    with open(os.path.join(path, "inside"), "w") as f:
        f.write("x")


def _put_fifo(path):
    os.remove(path)
    os.mkfifo(path, 0o600)


def _put_symlink_to_a_valid_copy(path):
    copy = os.path.join(os.path.dirname(os.path.dirname(path)), os.path.basename(path) + ".copy")
    shutil.copy(path, copy)
    os.remove(path)
    os.symlink(copy, path)


def _put_non_utf8(path):
    with open(path, "wb") as f:
        f.write(b"\xff\xfe\xfd" + b"\x80" * 61)


def _put_empty(path):
    open(path, "wb").close()


def _put_content_only_hash(path):
    """What an older vkml wrote: the SHA-256 of the content alone (no key)."""
    import hashlib
    with open(path[:-len(".sha256")], "rb") as f:
        h = hashlib.sha256(f.read()).hexdigest()
    with open(path, "w") as f:
        f.write(h)


def _put_other_users_mode(path):
    os.chmod(path, 0o666)


TAMPERINGS = {
    ("so", "directory"): _put_directory,
    ("so", "fifo"): _put_fifo,
    ("so", "symlink"): _put_symlink_to_a_valid_copy,
    ("so", "world-writable"): _put_other_users_mode,
    ("sidecar", "directory"): _put_directory,
    ("sidecar", "fifo"): _put_fifo,
    ("sidecar", "symlink"): _put_symlink_to_a_valid_copy,
    ("sidecar", "non-utf8"): _put_non_utf8,
    ("sidecar", "empty"): _put_empty,
    ("sidecar", "content-only hash"): _put_content_only_hash,
}


@pytest.mark.parametrize("which,how", list(TAMPERINGS), ids=[f"{a}-{b}" for a, b in TAMPERINGS])
def test_anything_unexpected_in_an_entry_is_rebuilt_never_trusted(tmp_path, which, how):
    env = child_env(tmp_path / "cache")
    assert run_child(env, 5.5)[0] == [[5.5, True]]
    (so,) = (tmp_path / "cache" / "cpu").glob("vk_*.so")
    TAMPERINGS[which, how](str(so) if which == "so" else str(so) + ".sha256")
    results, compiles, err = run_child(env, 5.5, 5.5, timeout=60)   # a FIFO must not hang it
    assert results == [[5.5, True], [5.5, False]] and compiles == 1, err
    assert WARNING not in err
    for p in (so, so.with_name(so.name + ".sha256")):                 # replaced by a regular file
        assert p.is_file() and not p.is_symlink()
    assert run_child(env, 5.5)[:2] == ([[5.5, False]], 0)


def test_a_corrupt_library_with_a_matching_hash_is_rebuilt(tmp_path):
    env = child_env(tmp_path / "cache")
    run_child(env, 6.5)
    (so,) = (tmp_path / "cache" / "cpu").glob("vk_*.so")
    key = so.name[len("vk_"):-len(".so")]
    bad = so.read_bytes()[:200] + b"\0not an elf body\0" * 50      # a truncated library
    so.write_bytes(bad)
    so.with_name(so.name + ".sha256").write_text(disk_cache.sidecar_text(key, bad))
    results, compiles, err = run_child(env, 6.5, 6.5)
    assert results == [[6.5, True], [6.5, False]] and compiles == 1, err
    assert so.read_bytes() != bad


def _swap(a, b):
    tmp = a + ".swap"
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def test_two_valid_entries_swapped_each_program_still_gets_its_own_result(cache):
    folder = str(cache / "cpu")
    a = new_entry(folder, 1.0)
    b = new_entry(folder, 2.0)
    _swap(a, b)
    _swap(a + ".sha256", b + ".sha256")
    vkml.reset_stats()
    assert value_of(1.0) == (1.0, True) and value_of(2.0) == (2.0, True)
    assert vkml.stats().compiles == 2
    assert value_of(1.0) == (1.0, False) and value_of(2.0) == (2.0, False)


PROGRAMS = textwrap.dedent("""
    import json, numpy as np, vkml
    vkml.set_backend("cpu")
    x = np.linspace(-1.0, 1.0, 33)
    f = vkml.jit(lambda t: vkml.tanh(t) * 3.0 + t * t)
    g = vkml.jit(lambda t: vkml.sin(t) - t * 0.5)
    print(json.dumps({"f": f(x).numpy().tolist(), "g": g(x).numpy().tolist(),
                      "compiles": vkml.stats().compiles}))
""")


def test_swapped_entries_of_two_programs_run_each_program_correctly(tmp_path):
    env = child_env(tmp_path / "cache", VKML_CPU_HOT="0")

    def run():
        out = subprocess.run([sys.executable, "-c", PROGRAMS], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    x = np.linspace(-1.0, 1.0, 33)
    first = run()
    assert first["compiles"] == 2
    np.testing.assert_allclose(first["f"], np.tanh(x) * 3.0 + x * x, rtol=1e-12)
    np.testing.assert_allclose(first["g"], np.sin(x) - x * 0.5, rtol=1e-12)
    a, b = sorted(str(p) for p in (tmp_path / "cache" / "cpu").glob("vk_*.so"))
    _swap(a, b)
    _swap(a + ".sha256", b + ".sha256")
    second = run()
    assert second["compiles"] == 2                               # both rebuilt, neither trusted
    assert second["f"] == first["f"] and second["g"] == first["g"]
    assert run()["compiles"] == 0


# -- races ---------------------------------------------------------------------------------------------

RACER = textwrap.dedent("""
    import ctypes, json, os, sys, time
    from vkml.backends import cpu
    import vkml
    SOURCE = {source!r}
    go, value, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    while not os.path.exists(go):
        time.sleep(0.001)
    wrong = 0
    for _ in range(rounds):
        lib, _ = cpu.library(SOURCE.format(value=value))
        fn = lib.vk_value
        fn.restype = ctypes.c_double
        wrong += fn() != value
    print(json.dumps({{"wrong": int(wrong), "compiles": vkml.stats().compiles}}))
""").format(source=SOURCE)


def _start_racers(env, go, value, rounds, n):
    return [subprocess.Popen([sys.executable, "-c", RACER, str(go), str(value), str(rounds)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(n)]


def _results(procs):
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_concurrent_builders_of_one_key_all_get_a_complete_library(tmp_path):
    env = child_env(tmp_path / "cache")
    go = tmp_path / "go"
    procs = _start_racers(env, go, 8.25, 10, 5)
    time.sleep(0.5)
    go.touch()                                                   # all start cold at once
    out = _results(procs)
    assert all(r["wrong"] == 0 for r in out)
    assert 1 <= sum(r["compiles"] for r in out) <= 5             # each built at most once
    names = sorted(p.name for p in (tmp_path / "cache" / "cpu").iterdir())
    assert len(names) == 2 and names[1] == names[0] + ".sha256"  # no temporary files left


WRITER = textwrap.dedent("""
    import os, sys, time
    from vkml.backends import disk_cache
    folder, name, key, go, stop, *first_reads = sys.argv[1:]
    with open(os.path.join(folder, name), "rb") as f:
        data = f.read()
    while not os.path.exists(go):
        time.sleep(0.001)
    n = 0
    while n < 60 or not all(os.path.exists(f) for f in first_reads):
        disk_cache.write_entry(folder, name, key, data)     # publish the same library again and again
        n += 1
    open(stop, "w").close()
""")

READER = textwrap.dedent("""
    import ctypes, json, os, sys, time
    from vkml.backends import cpu
    import vkml
    SOURCE = {source!r}
    ready, first_read, go, stop, value = sys.argv[1:5] + [float(sys.argv[5])]
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
    wrong = rounds = 0
    while not os.path.exists(stop):                        # read for as long as the writer writes
        lib, _ = cpu.library(SOURCE.format(value=value))
        fn = lib.vk_value
        fn.restype = ctypes.c_double
        wrong += fn() != value
        rounds += 1
        open(first_read, "w").close()
    print(json.dumps({{"wrong": int(wrong), "rounds": rounds, "compiles": vkml.stats().compiles}}))
""").format(source=SOURCE)


def test_readers_never_see_a_half_written_entry(tmp_path):
    """Three readers load the library again and again while a writer republishes it: the writer
    starts only when every reader is waiting and stops only once every reader has loaded it at
    least once (and after 60 writes), so reads and writes overlap whatever the machine's load."""
    env = child_env(tmp_path / "cache")
    run_child(env, 3.75)
    folder = tmp_path / "cache" / "cpu"
    (so,) = folder.glob("vk_*.so")
    key = so.name[len("vk_"):-len(".so")]
    stop, go = tmp_path / "stop", tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(3)]
    first_reads = [tmp_path / f"first-read{i}" for i in range(3)]
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(r), str(f), str(go), str(stop), "3.75"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for r, f in zip(ready, first_reads)]
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), so.name, key, str(go), str(stop),
                               *map(str, first_reads)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not all(r.exists() for r in ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()
        out = _results(readers)
    finally:
        go.touch()
        for f in first_reads:                                    # lets the writer end if a reader died
            f.touch()
        _, stderr = writer.communicate(timeout=60)
    assert writer.returncode == 0, stderr[-2000:]
    # a partial file would fail its hash and cost a compile: there were none
    assert [r["wrong"] for r in out] == [0, 0, 0] and [r["compiles"] for r in out] == [0, 0, 0]
    assert all(r["rounds"] >= 1 for r in out)


SWAPPER = textwrap.dedent("""
    import os, sys
    a, b, stop, busy = sys.argv[1:5]
    n = 0
    while not os.path.exists(stop):
        if n >= 100:
            open(busy, "w").close()
        for x, y in ((a, b), (a + ".sha256", b + ".sha256"), (a, b)):
            try:
                os.rename(x, x + ".swap")
                os.rename(y, x)
                os.rename(x + ".swap", y)
                n += 1
            except OSError:
                pass
    print(n)
""")


def test_a_process_swapping_entries_never_makes_us_run_the_wrong_code(cache):
    folder = str(cache / "cpu")
    a = new_entry(folder, 10.0)
    b = new_entry(folder, 20.0)
    stop, busy = cache / "stop", cache / "busy"
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, a, b, str(stop), str(busy)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        vkml.reset_stats()
        got, rounds = [], 0
        while rounds < 100 or not busy.exists():                 # reads overlap 100 swaps or more
            got += [value_of(v)[0] for v in (10.0, 20.0)]
            rounds += 1
            assert swapper.poll() is None, swapper.communicate()
    finally:
        stop.touch()
        stdout, stderr = swapper.communicate(timeout=60)
    assert swapper.returncode == 0, stderr
    assert int(stdout) > 100                                     # it was really swapping
    assert got == [10.0, 20.0] * rounds
    assert vkml.stats().compiles > 0                             # swapped entries were rebuilt


# -- the CUDA cubin cache uses the same rules ----------------------------------------------------------

def test_the_cubin_cache_rebuilds_swapped_or_corrupt_entries():
    from cuda_emulation import CXX, fake_driver
    if CXX is None:
        pytest.skip("no C++ compiler for the emulated GPU")
    x = np.linspace(-2.0, 2.0, 19)
    want_f, want_g = np.sin(x) * 3.25 - np.cos(x), np.tanh(x) + x * x

    def run(backend):
        backend.clear_cache()                                    # as a new process would
        backend.gpu.modules.clear()
        vkml.reset_stats()
        f = (vkml.sin(vkml.tensor(x)) * 3.25 - vkml.cos(vkml.tensor(x))).numpy()
        g = (vkml.tanh(vkml.tensor(x)) + vkml.tensor(x) * vkml.tensor(x)).numpy()
        np.testing.assert_allclose(f, want_f, rtol=1e-12)
        np.testing.assert_allclose(g, want_g, rtol=1e-12)
        return vkml.stats().compiles

    with fake_driver():
        backend = vkml.set_backend("cuda")
        try:
            folder = os.path.join(os.environ["VKML_CACHE_DIR"], "cuda")
            assert run(backend) == 2
            assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
            assert run(backend) == 0                             # from the disk cache
            a, b = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".cubin"))
            _swap(a, b)
            _swap(a + ".sha256", b + ".sha256")
            assert run(backend) == 2                             # key-bound sidecars: rebuilt
            key = os.path.basename(a)[len("vk_"):-len(".cubin")]
            bad = b"\0not a cubin\0" * 20
            with open(a, "wb") as f:
                f.write(bad)
            with open(a + ".sha256", "w") as f:
                f.write(disk_cache.sidecar_text(key, bad))
            assert run(backend) == 1                             # hash fine, fails to load: rebuilt
            os.remove(b)
            os.mkfifo(b)
            assert run(backend) == 1                             # a FIFO: no hang, rebuilt
            assert run(backend) == 0
        finally:
            vkml.set_backend("numpy")
