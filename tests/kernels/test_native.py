"""The compiled kernels run from their files without numba (prbmrm.kernels.native; issue 13, P8).

References: numba's own dispatch of the same kernels (bitwise), and a fresh
process, in which loading a kernel must not import numba.
"""

import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

from prbmrm.kernels import dense_numba as _dense_kernel

from prbmrm.kernels import native as _native

from prbmrm.kernels import pg_numba as _pg_kernel

# The dense kernel's loss codes with parameters each accepts (prbmrm.kernels.blocks._DENSE_LOSSES).
LOSS_PARAMS = [(code, np.array([0.3]) if code in (6, 7, 10, 11, 12) else np.zeros(0)) for code in range(14)]


def dense_case(code, seed=0):
    rng = np.random.default_rng(seed)
    rows, cols = 301, 37
    X = np.where(rng.random((rows, cols)) < 0.6, rng.standard_normal((rows, cols)), 0.0)
    y = np.where(rng.random(rows) < 0.5, 1.0, -1.0) if code <= 7 else rng.poisson(2.0, rows).astype(np.float64)
    w = rng.standard_normal(cols) * 0.3
    bounds = np.array([0, 1, 1, 120, 301], dtype=np.intp)
    return X, y, w, bounds


def csr_case(code):
    import scipy.sparse as sp

    X, y, w, bounds = dense_case(code)
    X = sp.csr_matrix(np.where(np.random.default_rng(code).random(X.shape) < 0.3, X, 0.0))
    return X, X @ w, y, bounds


def pg_cases(count=40, seed=3):
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        t, d = int(rng.integers(1, 50)), int(rng.integers(1, 20))
        A = rng.standard_normal((t, d))
        buffer = np.full((t + 3, t + 3), np.nan)
        buffer[:t, :t] = A @ A.T
        x0 = rng.uniform(size=t)
        cases.append((buffer, float(10.0 ** rng.uniform(-2, 2)), rng.standard_normal(t), x0 / x0.sum(),
                      float(10.0 ** rng.uniform(-9, -2)), bool(rng.integers(0, 2)), 100000))
    return cases


def numba_pg(case):
    G, scale, b, x0, tol, below, max_iter = case
    x = np.empty(b.size)
    steps, converged = _pg_kernel.pg_steps(G, scale, b, x0, x, tol, below, max_iter, np.empty((6, b.size)))
    return x, steps, converged


def numba_dense(code, p):
    X, y, w, bounds = dense_case(code)
    partials = np.full((bounds.size - 1, X.shape[1] + 1), np.nan)
    _dense_kernel.dense_pass(X, y, w, code, p, bounds, partials)
    return partials


def numba_csr(code, p):
    X, f, y, bounds = csr_case(code)
    partials = np.full((bounds.size - 1, X.shape[1] + 1), np.nan)
    _dense_kernel.csr_update(X.indptr, X.indices, X.data, f, y, code, p, bounds, partials)
    return partials


def test_pg_steps_from_its_file_equals_numba_bitwise():
    for case in pg_cases():
        G, scale, b, x0, tol, below, max_iter = case
        x = np.empty(b.size)
        assert _native.pg_steps(G, scale, b, x0, x, tol, below, max_iter) == numba_pg(case)[1:]
        assert x.tobytes() == numba_pg(case)[0].tobytes()
    assert _native.fallback_reason("pg_steps") is None


@pytest.mark.parametrize("code, p", LOSS_PARAMS)
def test_dense_pass_from_its_file_equals_numba_bitwise(code, p):
    X, y, w, bounds = dense_case(code)
    partials = np.full((bounds.size - 1, X.shape[1] + 1), np.nan)
    _native.dense_pass(X, y, w, code, p, bounds, partials)
    assert partials.tobytes() == numba_dense(code, p).tobytes()
    assert _native.fallback_reason("dense_pass") is None


@pytest.mark.parametrize("code, p", LOSS_PARAMS)
def test_csr_update_from_its_file_equals_numba_bitwise(code, p):
    X, f, y, bounds = csr_case(code)
    partials = np.full((bounds.size - 1, X.shape[1] + 1), np.nan)
    _native.csr_updater(X, f, y, code, p, bounds, partials)()
    assert partials.tobytes() == numba_csr(code, p).tobytes()
    assert _native.fallback_reason("csr_update") is None


def test_the_kernels_refuse_arrays_they_cannot_read():
    X, y, w, bounds = dense_case(0)
    partials = np.zeros((bounds.size - 1, X.shape[1] + 1))
    with pytest.raises(ValueError, match="C-contiguous"):
        _native.dense_pass(np.asfortranarray(X), y, w, 0, np.zeros(0), bounds, partials)
    with pytest.raises(ValueError, match="shapes"):
        _native.dense_pass(X, y, w, 0, np.zeros(0), bounds, partials[:, :-1].copy())
    G, scale, b, x0, tol, below, max_iter = pg_cases(1)[0]
    with pytest.raises(ValueError, match="C-contiguous"):
        _native.pg_steps(G, scale, b, x0[:-1].copy(), np.empty(b.size), tol, below, max_iter)
    X, f, y, bounds = csr_case(0)
    long_indices = X.copy()
    long_indices.indices = X.indices.astype(np.int64)
    with pytest.raises(ValueError, match="int32 indices"):
        _native.csr_updater(long_indices, f, y, 0, np.zeros(0), bounds, partials)
    with pytest.raises(ValueError, match="shapes"):
        _native.csr_updater(X, f[:-1].copy(), y, 0, np.zeros(0), bounds, partials)


CHILD = """
import pickle, sys
import numpy as np
from prbmrm.kernels import native as _native
pg_cases, dense_cases, csr_cases = pickle.loads(sys.stdin.buffer.read())
out = []
for G, scale, b, x0, tol, below, max_iter in pg_cases:
    x = np.empty(b.size)
    out.append((x, _native.pg_steps(G, scale, b, x0, x, tol, below, max_iter)))
for X, y, w, code, p, bounds in dense_cases:
    partials = np.full((bounds.size - 1, X.shape[1] + 1), np.nan)
    _native.dense_pass(X, y, w, code, p, bounds, partials)
    out.append(partials)
for X, f, y, code, p, bounds in csr_cases:
    partials = np.full((bounds.size - 1, X.shape[1] + 1), np.nan)
    _native.csr_updater(X, f, y, code, p, bounds, partials)()
    out.append(partials)
reasons = [_native.fallback_reason(name) for name in ("pg_steps", "dense_pass", "csr_update")]
modules = sorted(name for name in ("numba", "llvmlite") if name in sys.modules)
sys.stdout.buffer.write(pickle.dumps((out, modules, reasons)))
"""


def run_child(env=None):
    """Run the kernels in a fresh process; return (results, which of numba and llvmlite it imported, fallback
    reasons)."""
    dense = [(*dense_case(code)[:3], code, p, dense_case(code)[3]) for code, p in LOSS_PARAMS]
    csr = [(*csr_case(code)[:3], code, p, csr_case(code)[3]) for code, p in LOSS_PARAMS]
    done = subprocess.run([sys.executable, "-c", CHILD], input=pickle.dumps((pg_cases(10), dense, csr)),
                          capture_output=True, env=env, timeout=300, check=True)
    return pickle.loads(done.stdout)


def expected():
    return [(x, (steps, converged)) for x, steps, converged in map(numba_pg, pg_cases(10))] + [
        numba_dense(code, p) for code, p in LOSS_PARAMS] + [numba_csr(code, p) for code, p in LOSS_PARAMS]


def assert_same(results, reference):
    for got, want in zip(results, reference, strict=True):
        if isinstance(want, tuple):
            assert got[1] == want[1] and got[0].tobytes() == want[0].tobytes()
        else:
            assert got.tobytes() == want.tobytes()


def test_a_process_runs_the_kernels_from_their_files_without_numba():
    # This process made the files (above, or now); a new one only loads them: no numba, and with ld's
    # shared libraries no llvmlite either.
    how = "shared library" if shutil.which("ld") else "object through llvmlite"
    assert _native.make_all() == {name: how for name in _native.KERNELS}
    results, modules, reasons = run_child()
    assert reasons == [None, None, None]
    assert modules == ([] if shutil.which("ld") else ["llvmlite"])
    assert_same(results, expected())


def test_kernel_files_are_made_where_missing_and_again_where_damaged(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    results, modules, reasons = run_child(env)  # none yet: made with numba
    assert reasons == [None, None, None] and "numba" in modules
    assert_same(results, expected())
    kernels = sorted((tmp_path / "prbmrm").glob("*.kernel"))
    assert [f.name.split("-")[0] for f in kernels] == ["csr_update", "dense_pass", "pg_steps"]
    whole = kernels[2].read_bytes()
    kernels[2].write_bytes(whole[: len(whole) // 2])  # cut short, as by a full disk
    results, modules, reasons = run_child(env)
    assert reasons == [None, None, None] and "numba" in modules  # pg_steps was made again
    assert_same(results, expected())
    assert kernels[2].read_bytes() == whole
    # Without the shared libraries (no ld where they were made), llvmlite loads the objects: the same bits.
    for library in (tmp_path / "prbmrm").glob("*.so"):
        library.unlink()
    results, modules, reasons = run_child(env)
    assert reasons == [None, None, None] and modules == ["llvmlite"]
    assert_same(results, expected())


def test_kernels_run_where_their_files_cannot_be_written(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(blocker))  # its prbmrm/ cannot be made
    results, modules, reasons = run_child(env)
    assert reasons == [None, None, None] and "numba" in modules
    assert_same(results, expected())
    done = subprocess.run([sys.executable, "-c", "import prbmrm.kernels.native as n; print(n.make_all())"], env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=True)
    assert done.stdout.count("object through llvmlite; files not written: ") == len(_native.KERNELS)


def test_without_jit_the_numba_functions_run_and_say_why():
    results, _, reasons = run_child(dict(os.environ, NUMBA_DISABLE_JIT="1"))
    assert all("NUMBA_DISABLE_JIT" in reason for reason in reasons)
    assert_same(results[:10], expected()[:10])  # the plain-Python pg steps are the kernel's, bitwise


def test_the_error_path_stubs_name_themselves_and_abort():
    # numba's code calls numba's runtime and the Python C API on error paths only; in a kernel file
    # they are stubs that write a message and abort.
    _native.function("pg_steps")
    library = next(_native.cache_dir().glob("pg_steps-*.so"), None)
    if library is None:
        pytest.skip("no ld: the kernels load as objects through llvmlite (tested above)")
    script = f"import ctypes; ctypes.CDLL({str(library)!r})['numba_gil_ensure'](None)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode != 0 and "prbmrm: a compiled kernel reached an error path" in done.stderr
    undefined = _native.undefined_symbols(_native._parse(library.with_suffix(".kernel").read_bytes())[1])
    assert undefined and not [name for name in undefined if name.startswith(_native._STUBBED)]  # libc's, libm's


def test_undefined_symbols_reads_only_elf64_objects():
    with pytest.raises(_native.KernelLoadError, match="ELF64"):
        _native.undefined_symbols(b"\xcf\xfa\xed\xfe" + bytes(60))


def test_no_numpy_steps_once_a_kernel_file_is_loaded(monkeypatch):
    # The projected-gradient steps start in numpy only while no kernel file is loaded.
    import prbmrm.regularizers.qp as qp

    _native.function("pg_steps")
    assert _native.loaded()
    monkeypatch.setattr(qp._NumpySteps, "taken", 0)
    G, scale, b, x0, tol, below, max_iter = pg_cases(1)[0]
    qp.solve_simplex_pg(G, b, x0, tol, 0.1 if below else None, max_iter, scale)
    assert qp._NumpySteps.taken == 0
