"""The compiled kernels, run from machine code kept on disk: numba compiles them, but a run does not load numba.

numba's ``cache=True`` spares a process compiling a kernel, not loading
numba: the first call of a cached kernel imports numba and builds its typing
and lowering registries, 0.4-0.5 s and about 70 MB per process here
(docs/performance.md, "Start-up"), most of what BMRM 2.1 spends on a whole
a9a run at lam 1e-4. So each kernel (:data:`KERNELS`) also has a C entry
point, a numba ``cfunc`` on raw pointers that a function of its module
builds. Once per machine numba compiles it, and its optimized LLVM module is
emitted as position-independent object code for this CPU into a file
(:func:`cache_dir`), and linked by the system's ``ld`` into a shared library
beside it where ``ld`` exists. A process loads the library with ``dlopen``
(under a millisecond, no LLVM in memory) or else the object with llvmlite
(the LLVM binding numba itself uses: about 25 ms and 40 MB), and calls the
entry point through ctypes. Every process, the one that made the files too,
runs the code from them: all ranks and runs execute the same instructions.

The kernels need only libc and libm: the Python C API and numba's runtime,
which numba's code calls on error paths alone, get stubs that say so and
abort. Those paths are never taken: the kernels allocate nothing, and
numpy's error model raises nothing.

Where no file can be made or loaded (no llvmlite, ``NUMBA_DISABLE_JIT``, a
platform other than ELF64 Linux, an object that does not link), the kernel
module's numba functions run instead, compiled from the same code.

Imports: numpy (llvmlite to make a kernel file or load one without ``ld``); of prbmrm: the kernel modules only
to make the files.
"""

import ctypes
import functools
import hashlib
import importlib
import importlib.util
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

FORMAT = b"prbmrm-kernel-2\n"
"""The first line of a kernel file (then the entry's symbol, the sha256 of the object code, an empty line
and the code); a change of the layout or of how the code is made changes it."""

_c_double, _c_int64, _c_void_p = ctypes.c_double, ctypes.c_int64, ctypes.c_void_p
# name: (module, its function that compiles the entry point, return type, argument types)
KERNELS = {
    "pg_steps": ("prbmrm.kernels.pg_numba", "entry", _c_int64, (
        _c_void_p, _c_int64, _c_int64, _c_double, _c_void_p, _c_void_p, _c_void_p, _c_int64, _c_double, _c_int64,
        _c_int64, _c_void_p, _c_void_p)),
    "dense_pass": ("prbmrm.kernels.dense_numba", "dense_entry", None, (
        _c_void_p, _c_int64, _c_int64, _c_void_p, _c_void_p, _c_int64, _c_void_p, _c_int64, _c_void_p, _c_int64,
        _c_void_p)),
    "csr_update": ("prbmrm.kernels.dense_numba", "csr_entry", None, (
        _c_void_p, _c_void_p, _c_void_p, _c_int64, _c_int64, _c_int64, _c_void_p, _c_void_p, _c_int64, _c_void_p,
        _c_int64, _c_void_p, _c_int64, _c_void_p)),
}

# External symbols of numba's code that only its error paths use: the Python C API and numba's runtime.
_STUBBED = ("Py", "_Py", "numba_", "NRT_")
_STUB_MESSAGE = (b"prbmrm: a compiled kernel reached an error path (a Python or numba runtime call), which it "
                 b"never should; please report this (prbmrm.kernels.native)\n")

_lock = threading.RLock()
_loaded = {}  # name -> ctypes function, or the reason the numba functions run (str)
_keep = []  # what the loaded functions live in: shared libraries, llvmlite's engine and objects
_engine = []  # [llvmlite binding, MCJIT engine], made on first use
_how = {}  # name -> how its code was loaded (make_all)
_unwritten = {}  # name -> why its files could not be written


class KernelLoadError(RuntimeError):
    """A kernel file could not be made or linked (the numba functions run instead)."""


def cache_dir():
    """The directory of the kernel files: ``$NUMBA_CACHE_DIR/prbmrm`` if set, else the package's
    ``__pycache__`` if writable (numba's own choice for its cache), else ``~/.cache/prbmrm``."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"]) / "prbmrm"
    in_tree = Path(__file__).resolve().parent / "__pycache__"
    if os.access(in_tree if in_tree.exists() else in_tree.parent, os.W_OK):
        return in_tree
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prbmrm"


def function(name):
    """The ctypes function of kernel `name`'s entry point, or None where the numba functions must run.

    Loads the kernel's files, making them first if none match this kernel's
    source, numba, llvmlite, Python and CPU (:func:`cache_dir`).
    """
    with _lock:
        if name not in _loaded:
            try:
                _loaded[name] = _load(name)
            except (KernelLoadError, ImportError, OSError, subprocess.SubprocessError) as error:
                _loaded[name] = f"{type(error).__name__}: {error}"
        found = _loaded[name]
        return None if isinstance(found, str) else found


def make_all():
    """Make (or check) every kernel's files, e.g. when building an image; return {name: how it runs}.

    How: ``"shared library"``, ``"object through llvmlite"`` (no ``ld``), or
    ``"numba: "`` and why; then ``"; files not written: "`` and why, where
    they could not be (each process then compiles the kernel again).
    """
    found = {name: function(name) for name in KERNELS}
    return {name: (_how[name] if found[name] else f"numba: {fallback_reason(name)}")
            + (f"; files not written: {_unwritten[name]}" if name in _unwritten else "") for name in KERNELS}


def loaded():
    """Whether this process has loaded a kernel from its files already (another then costs it little)."""
    return any(not isinstance(found, str) for found in _loaded.values())


def fallback_reason(name):
    """Why kernel `name` runs in numba (None: it runs from its files, or was not called yet)."""
    found = _loaded.get(name)
    return found if isinstance(found, str) else None


def _llvm():
    """llvmlite's binding, its native target initialized."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm


@functools.cache
def _key(module):
    """The hash the kernel files are named by: what their machine code depends on (without loading LLVM).

    Once per module and process (two kernels share a module)."""
    digest = hashlib.sha256(FORMAT)
    numba_dir = Path(importlib.util.find_spec("numba").origin).parent
    llvmlite_dir = Path(importlib.util.find_spec("llvmlite").origin).parent
    for path in (Path(importlib.util.find_spec(module).origin), numba_dir / "__init__.py",
                 numba_dir / "_version.py", llvmlite_dir / "_version.py"):
        digest.update(path.read_bytes() if path.exists() else b"-")
    for part in (_cpu(), sys.version, platform.machine()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:24]


def _cpu():
    """This CPU's model and feature flags, as LLVM's choice of code depends on them (Linux's /proc/cpuinfo)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace").split("\n\n")[0]
    except OSError:
        return platform.processor()
    return "\n".join(line for line in text.splitlines()
                     if line.split(":")[0].strip() in ("vendor_id", "cpu family", "model", "flags", "Features",
                                                       "CPU implementer", "CPU part"))


def _load(name):
    if os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0"):
        raise KernelLoadError("NUMBA_DISABLE_JIT is set")
    if sys.byteorder != "little" or struct.calcsize("P") != 8 or not sys.platform.startswith("linux"):
        raise KernelLoadError("kernel files are made for 64-bit little-endian Linux (ELF64) only")
    module, builder, restype, argtypes = KERNELS[name]
    base = cache_dir() / f"{name}-{_key(module)}"
    try:
        symbol, code = _parse(base.with_suffix(".kernel").read_bytes())
    except (OSError, ValueError):  # none yet, or not whole
        symbol, code = _make(module, builder, base)
    address = _from_library(base.with_suffix(".so"), symbol)
    _how[name] = "shared library" if address else "object through llvmlite"
    address = address or _link(code, symbol)
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


def _parse(blob):
    """(entry symbol, object code) of a kernel file's bytes; ValueError unless whole."""
    header, _, code = blob.partition(b"\n\n")
    magic, symbol, digest = (header + b"\n").split(b"\n")[:3]
    if magic + b"\n" != FORMAT or hashlib.sha256(code).hexdigest().encode() != digest:
        raise ValueError("not a whole kernel file")
    return symbol.decode(), code


def _make(module, builder, base):
    """Compile `module`'s entry point (its function `builder`) with numba; write its object code to
    ``base.kernel`` and, where ``ld`` exists, the shared library ``base.so``; return (symbol, code).

    Each file is written whole or not at all (ranks making them at once each write their own, then
    rename); where none can be written this process still runs the code it made.
    """
    llvm = _llvm()
    entry = getattr(importlib.import_module(module), builder)()
    kernel = llvm.parse_assembly(entry.inspect_llvm())
    kernel.link_in(llvm.parse_assembly(_stubs(kernel)))
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3, reloc="pic",
        codemodel="default")
    code = machine.emit_object(kernel)
    symbol = entry.native_name
    blob = FORMAT + symbol.encode() + b"\n" + hashlib.sha256(code).hexdigest().encode() + b"\n\n" + code
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        _write(base.with_suffix(".kernel"), lambda path: path.write_bytes(blob))
        linker = shutil.which("ld")
        if linker:
            with tempfile.TemporaryDirectory() as work:
                obj = Path(work) / "kernel.o"
                obj.write_bytes(code)
                _write(base.with_suffix(".so"), lambda path: subprocess.run(
                    [linker, "-shared", "-o", str(path), str(obj)], check=True, stdin=subprocess.DEVNULL,
                    capture_output=True, timeout=120))
    except (OSError, subprocess.SubprocessError) as error:
        _unwritten[base.name.split("-")[0]] = f"{type(error).__name__}: {error}"
    return symbol, code


def _write(path, write):
    """Make `path` by `write(temporary path)` then rename it, so that it appears whole or not at all."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _stubs(kernel):
    """LLVM IR defining each external symbol of `kernel` in :data:`_STUBBED`: a function that writes
    :data:`_STUB_MESSAGE` and aborts, or a zero byte for a variable (an exception type's address)."""
    lines = [f"@prbmrm.stub.message = private unnamed_addr constant [{len(_STUB_MESSAGE)} x i8] c\""
             + "".join(f"\\{byte:02X}" for byte in _STUB_MESSAGE) + "\"",
             "declare i64 @write(i32, ptr, i64)", "declare void @abort()"]
    for value in list(kernel.functions) + list(kernel.global_variables):
        if not value.is_declaration or not value.name.startswith(_STUBBED):
            continue
        if value.is_function:
            result, _, arguments = str(value.global_value_type).partition(" (")
            lines += [f"define {result} @{value.name}({arguments} {{",
                      f"  call i64 @write(i32 2, ptr @prbmrm.stub.message, i64 {len(_STUB_MESSAGE)})",
                      "  call void @abort()", "  unreachable", "}"]
        else:
            lines.append(f"@{value.name} = global {value.global_value_type} zeroinitializer")
    return "\n".join(lines) + "\n"


def _from_library(path, symbol):
    """The address of `symbol` in the shared library `path`, or None where there is none or it does not load."""
    if not path.exists():
        return None
    try:
        library = ctypes.CDLL(str(path))
        address = ctypes.cast(library[symbol], ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    _keep.append(library)
    return address


def _link(code, symbol):
    """Add the object `code` to llvmlite's MCJIT engine, resolving its external symbols in the process; return
    the address of `symbol`."""
    if not _engine:
        llvm = _llvm()
        machine = llvm.Target.from_default_triple().create_target_machine(jit=True)
        _engine.extend([llvm, llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)])
    llvm, engine = _engine
    dlsym = ctypes.CDLL(None).dlsym
    dlsym.restype, dlsym.argtypes = ctypes.c_void_p, (ctypes.c_void_p, ctypes.c_char_p)
    for name in undefined_symbols(code):
        if not llvm.address_of_symbol(name):
            address = dlsym(None, name.encode())
            if not address:
                raise KernelLoadError(f"the kernel needs symbol {name!r}, which this process lacks")
            llvm.add_symbol(name, address)
    obj = llvm.ObjectFileRef.from_data(code)
    _keep.append(obj)
    engine.add_object_file(obj)
    engine.finalize_object()
    address = engine.get_function_address(symbol)
    if not address:
        raise KernelLoadError(f"the kernel file defines no {symbol!r}")
    return address


def undefined_symbols(code):
    """The names of the undefined symbols of the ELF64 (little-endian) object `code`."""
    if code[:4] != b"\x7fELF" or code[4] != 2 or code[5] != 1:
        raise KernelLoadError("the kernel file holds no ELF64 little-endian object")
    offset, = struct.unpack_from("<Q", code, 0x28)
    size, count = struct.unpack_from("<HH", code, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", code, offset + i * size) for i in range(count)]
    names = []
    for _, kind, _, _, start, length, link, _, _, entry in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for at in range(start, start + length, entry):
            name, _, _, index = struct.unpack_from("<IBBH", code, at)
            if index == 0 and name:  # SHN_UNDEF
                names.append(code[strings + name:code.index(b"\0", strings + name)].decode())
    return names


def _pointer(array):
    return array.__array_interface__["data"][0]


def pg_steps(G, scale, b, x0, x, tol, below, max_iter):
    """:func:`prbmrm.kernels.pg_numba.pg_steps` (its arguments less the scratch), from the kernel file; return
    (steps, converged).

    `G` and the vectors are C-contiguous float64 (`G` at least n x n, its leading block read); `x` is written.
    """
    n = b.size
    work = np.empty((6, n))
    kernel = function("pg_steps")
    if kernel is None:
        from .pg_numba import pg_steps as compiled

        return compiled(G, scale, b, x0, x, tol, below, max_iter, work)
    if not (all(a.flags.c_contiguous and a.dtype == np.float64 for a in (G, b, x0, x))
            and x0.size == x.size == n and G.shape[0] >= n and G.shape[1] >= n):
        raise ValueError("pg_steps needs C-contiguous float64 arrays: vectors of one size n, G at least n x n")
    converged = np.zeros(1, dtype=np.int64)
    steps = kernel(_pointer(G), G.shape[0], G.shape[1], scale, _pointer(b), _pointer(x0), _pointer(x), n, tol,
                   int(below), max_iter, _pointer(work), _pointer(converged))
    return int(steps), bool(converged[0])


def dense_pass(X, y, w, code, p, bounds, partials):
    """:func:`prbmrm.kernels.dense_numba.dense_pass`, from the kernel file: fill `partials` in place.

    Every array C-contiguous, float64 but `bounds` (intp); `partials` is
    ``(len(bounds) - 1) x (X.shape[1] + 1)``.
    """
    kernel = function("dense_pass")
    if kernel is None:
        from .dense_numba import dense_pass as compiled

        compiled(X, y, w, code, p, bounds, partials)
        return
    _check("dense_pass", (X, y, w, p, partials), (), X.shape, y, bounds, partials)
    if w.size != X.shape[1]:
        raise ValueError("dense_pass: the arrays' shapes do not agree")
    kernel(_pointer(X), X.shape[0], X.shape[1], _pointer(y), _pointer(w), code, _pointer(p), p.size, _pointer(bounds),
           bounds.size, _pointer(partials))


def csr_updater(X, f, y, code, p, bounds, partials):
    """:func:`prbmrm.kernels.dense_numba.csr_update` on the CSR matrix `X` with row scores `f`, from the kernel file,
    bound to these arrays: return a function of no arguments that fills `partials` in place.

    `X` has int32 ``indptr`` and ``indices`` and float64 ``data``; every
    other array is as for :func:`dense_pass`. The arrays are checked once,
    here, and must keep their places (a risk oracle's storage).
    """
    kernel = function("csr_update")
    indptr, indices, data = X.indptr, X.indices, X.data
    if kernel is None:
        from .dense_numba import csr_update as compiled

        return functools.partial(compiled, indptr, indices, data, f, y, code, p, bounds, partials)
    _check("csr_update", (data, f, y, p, partials), (indptr, indices), X.shape, y, bounds, partials)
    if f.size != X.shape[0] or indptr.size != X.shape[0] + 1:
        raise ValueError("csr_update: the arrays' shapes do not agree")
    update = functools.partial(kernel, _pointer(indptr), _pointer(indices), _pointer(data), X.shape[0], data.size,
                               X.shape[1], _pointer(f), _pointer(y), code, _pointer(p), p.size, _pointer(bounds),
                               bounds.size, _pointer(partials))
    update.arrays = (indptr, indices, data, f, y, p, bounds, partials)  # alive as long as their addresses are used
    return update


def _check(name, floats, int32s, shape, labels, bounds, partials):
    """Raise ValueError unless the arrays are C-contiguous of their types (`bounds` intp) and `labels` and
    `partials` fit the rows and blocks of a matrix of `shape`."""
    typed = [(a, np.float64) for a in floats] + [(a, np.int32) for a in int32s] + [(bounds, np.intp)]
    if not all(a.flags.c_contiguous and a.dtype == dtype for a, dtype in typed):
        raise ValueError(f"{name} needs C-contiguous arrays: float64 values, int32 indices, intp bounds")
    if (partials.shape != (bounds.size - 1, shape[1] + 1) or labels.size != shape[0]
            or (bounds.size and not 0 <= bounds[0] <= bounds[-1] <= shape[0])):
        raise ValueError(f"{name}: the arrays' shapes do not agree")
