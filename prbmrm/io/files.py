"""Output files a job can trust: atomic HDF5 writes that fail cleanly, and claims on output names.

:func:`write_hdf5` builds the file in memory and writes the bytes itself
(:func:`hdf5_image`, :func:`write_image`; shard files go the same way), so a
full disk or an exhausted quota is one :class:`~prbmrm.errors.InputError`
naming the file, never a crash: HDF5 writing to a full disk fails in its
flush and then crashes the process when the file is closed (SIGSEGV in
``H5Fclose``, or "Slist already enabled?" tracebacks). The cost is one copy
of the file in memory while it is written.

:class:`OutputClaim` takes an exclusive ``flock`` on ``.NAME.lock`` next to
each output a job writes (model, checkpoint, JSON log), so a second job
given the same name stops at once, naming the file and the job that holds
it, instead of both writing it.

The reading side has the checks every HDF5 file prbmrm reads shares:
:func:`stored_problem` (a dataset's declared size against the bytes the file
stores, before anything is read), :func:`check_memory` (a size a file
declares against the memory available, before anything is allocated) and
:func:`private_problem` (a secret file readable by others).

Imports: h5py and :mod:`prbmrm.errors` only.
"""

import contextlib
import datetime
import fcntl
import io
import os
import platform
import stat

import h5py

from ..version import __version__
from ..errors import InputError, UsageError


def temporary_name(path):
    """The name ``.NAME.tmp-PID`` in the directory of `path` that an atomic write goes through."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def write_hdf5(path, file_format, fill, what):
    """Write an HDF5 file atomically: build it in memory, write it to a temporary name, fsync, rename.

    Parameters
    ----------
    path : str
        The file to create or replace.
    file_format : str
        Its ``format`` attribute (``version`` is the package's).
    fill : callable
        ``fill(f)`` writes the contents into the open ``h5py.File`` f.
    what : str
        What the file is, for the message (e.g. ``"model file"``).

    Raises
    ------
    InputError
        If the bytes cannot be written (disk full, quota, file size limit,
        I/O error); the temporary file is removed and a previous `path` is
        left as it was.
    """
    def fill_format(f):
        f.attrs["format"] = file_format
        f.attrs["version"] = __version__
        fill(f)

    image = hdf5_image(fill_format)
    temporary = temporary_name(path)
    try:
        write_image(temporary, image)
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        if isinstance(error, OSError):
            raise InputError(f"{path}: cannot write the {what}: {error.strerror or error} "
                             "(nothing written; a previous file of that name is unchanged)") from None
        raise


def hdf5_image(fill):
    """Return the bytes (an io.BytesIO) of an HDF5 file built in memory by ``fill(f)``."""
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        fill(f)
    return image


def write_image(path, image):
    """Write the bytes of `image` (an io.BytesIO) to a new file `path` and fsync it.

    Raises
    ------
    OSError
        If they cannot all be written (disk full, quota, file size limit);
        the caller removes `path`.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = image.getbuffer()
        while len(view):
            view = view[os.write(descriptor, view):]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def private_problem(status):
    """Why a secret file of ``os.stat`` result `status` is not private to the running user, or None.

    As ssh refuses a private key that its group or others may read or write.
    """
    if status.st_mode & 0o077:
        return f"is accessible to others (mode {stat.S_IMODE(status.st_mode):04o})"
    if hasattr(os, "geteuid") and status.st_uid != os.geteuid():
        return f"belongs to another user (uid {status.st_uid})"
    return None


def stored_problem(dataset):
    """What is wrong with the size of the HDF5 `dataset` (as a phrase), or None.

    A file may declare a dataset of any shape while storing nothing (HDF5
    allocates late and reads unwritten parts as fill values): reading it
    would allocate what the shape says. prbmrm writes every dataset whole,
    contiguous and uncompressed, so its stored bytes must cover its shape.
    """
    if dataset.dtype.kind not in "biuf" or dataset.dtype.itemsize > 8:
        return f"has type {dataset.dtype}, not a number type"
    declared = dataset.size * dataset.dtype.itemsize
    if dataset.compression is not None or dataset.id.get_create_plist().get_nfilters():
        return "is compressed (prbmrm's files store datasets uncompressed)"
    stored = dataset.id.get_storage_size()
    if stored < declared:
        return (f"declares {dataset.shape} values of {dataset.dtype} ({_bytes(declared)}) but stores "
                f"{_bytes(stored)}")
    return None


def _bytes(n):
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def available_memory():
    """Bytes of memory available to this process now (Linux: ``MemAvailable``; else free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_memory(path, nbytes, what):
    """Raise unless `nbytes` (what `path` declares it needs, `what`) fits in the memory available.

    Raises
    ------
    InputError
        Naming `path`, `what` and both sizes.
    """
    available = available_memory()
    if nbytes > available:
        raise InputError(f"{path}: {what} needs {_bytes(nbytes)}, more than the {_bytes(available)} of memory "
                         "available")


def lock_name(path):
    """The lock file ``.NAME.lock`` of the output `path`."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.lock")


class OutputClaim:
    """Context manager: this process's exclusive claim on the output files it will write.

    Each file gets the lock file ``.NAME.lock`` beside it, held with
    ``flock(LOCK_EX | LOCK_NB)`` and holding a line that describes this job;
    leaving the context removes the lock files. A lock file left by a killed
    job is not held (the kernel drops a dead process's locks) and is taken
    over. ``flock`` works across the hosts of an NFS mount (Linux maps it to
    NFS locks) and on local and Lustre file systems mounted with locking.

    Parameters
    ----------
    outputs : dict of str to str or None
        The option that names each file (e.g. ``"--out"``) to its path; None
        paths are skipped.
    program : str
        The program, for the holder's description.

    Raises
    ------
    InputError
        On entry, if another process holds one of the files (the message
        names the file and the holder), or a lock file cannot be created.
    UsageError
        On entry, if two options name the same file.
    """

    def __init__(self, outputs, program):
        self.outputs = {option: path for option, path in outputs.items() if path is not None}
        self.program = program
        self._held = []

    def __enter__(self):
        seen = {}
        for option, path in self.outputs.items():
            real = os.path.realpath(path)
            if real in seen:
                raise UsageError(f"{path}: given to both {seen[real]} and {option}; "
                                 "each output needs its own file")
            seen[real] = option
        try:
            for option, path in self.outputs.items():
                self._held.append((lock_name(path), self._acquire(path, option)))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _acquire(self, path, option):
        lock = lock_name(path)
        while True:
            try:
                descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as error:
                raise InputError(f"{path}: cannot write the {option} file: output path not writable "
                                 f"(cannot create its lock file {lock}: {error.strerror or error})") from None
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(descriptor, 1000, 0).decode(errors="replace").strip() or "another process"
                os.close(descriptor)
                raise InputError(f"{path}: in use by {holder} (lock file {lock}); wait for that job "
                                 "or write to another file") from None
            # The previous holder removes the file when it is done: if it did so after
            # we opened it, we hold a lock on a removed file and must take the new one.
            try:
                if os.path.samestat(os.fstat(descriptor), os.stat(lock)):
                    break
            except FileNotFoundError:
                pass
            os.close(descriptor)
        started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        try:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, f"{self.program} (pid {os.getpid()} on {platform.node()}, "
                                  f"started {started})\n".encode(), 0)
        except OSError as error:  # a full disk or quota: the lock file is ours, remove it
            with contextlib.suppress(OSError):
                os.remove(lock)
            os.close(descriptor)
            raise InputError(f"{path}: cannot write the {option} file: cannot write its lock file {lock} "
                             f"({error.strerror or error})") from None
        return descriptor

    def __exit__(self, *exc):
        while self._held:
            lock, descriptor = self._held.pop()
            with contextlib.suppress(OSError):
                os.remove(lock)  # while still held: no other job can have taken it
            os.close(descriptor)
        return False
