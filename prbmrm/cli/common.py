"""What the command-line entry points share: argument errors and exit handling.

Every rank parses the same argv and validates options the same way, so those
errors are collective by construction; file problems go through
``comm.check``. Only rank 0 prints an error; every rank exits non-zero. An
unexpected exception on one rank aborts the whole job (MPI_Abort) instead of
leaving the others blocked in a collective call. Before anything else, the
ranks check that the launcher started as many of them as MPI connected
(:func:`prbmrm.distributed.comm.check_launch`).

Imports: threadpoolctl; of prbmrm: :mod:`prbmrm.distributed.comm`, :mod:`prbmrm.errors`, :mod:`prbmrm.distributed.messages`.
"""

import argparse
import os
import sys
import traceback
import warnings

from ..errors import CollectiveError, CoordinatorError, PrbmrmError, UsageError
from ..distributed.messages import ProtocolError

EXIT_INPUT = 2
EXIT_BUG = 1

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


INVOKED_AS = {}
"""Entry module -> the name the user typed for it (``"prbmrm.cli.train"`` -> ``"prbmrm train"``), set by the
``prbmrm`` command (:mod:`prbmrm.__main__`) before it runs the module."""


def program(module):
    """The program name of entry module `module` in usage and messages: as the user typed it.

    ``prbmrm train ...`` reports as ``prbmrm train``, ``python -m prbmrm.cli.train ...`` as ``prbmrm.cli.train``.
    """
    return INVOKED_AS.get(module, module)


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors become :class:`UsageError` (no usage dump per rank); its
    ``prog``, an entry module's name, is shown as the user typed it (:func:`program`)."""

    def __init__(self, prog=None, **kwargs):
        super().__init__(prog=None if prog is None else program(prog), **kwargs)

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def blas_threads(size, environ):
    """BLAS threads per process, or None to leave the pools alone.

    Under MPI the cores Slurm gave the task (``SLURM_CPUS_PER_TASK``), else
    one; a serial run keeps what the environment asks for
    (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``), else one.
    """
    cores = environ.get("SLURM_CPUS_PER_TASK", "").strip()
    if size > 1:
        return int(cores) if cores.isdigit() and int(cores) > 0 else 1
    return None if any(name in environ for name in _THREAD_VARIABLES) else 1


def pinned(threads, environ):
    """Whether a process just started with `environ` runs every BLAS and OpenMP pool on `threads` threads.

    ``OMP_NUM_THREADS`` says so for OpenMP, and for OpenBLAS, MKL and BLIS
    unless their own variables say otherwise. Then the command line need not
    set the limit (threadpoolctl: 10 ms of a rank's start-up, finding the
    pools in every loaded library).
    """
    own = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
    return (environ.get("OMP_NUM_THREADS", "").strip() == str(threads)
            and all(environ.get(name, "").strip() in ("", str(threads)) for name in own))


def run(main, prog, argv=None):
    """Run ``main(argv, comm)`` and turn its errors into one message and an exit status.

    Parameters
    ----------
    main : callable
        ``main(argv, comm) -> int``.
    prog : str
        Program name for messages, e.g. ``"prbmrm.cli.train"``.
    argv : list of str, optional

    Returns
    -------
    int
        The exit status (0 on success).
    """
    from ..distributed.comm import check_launch, get_comm

    prog = program(prog)

    comm = get_comm()
    # Warnings (e.g. party mode's LeakWarning) read like errors: one line, the program's name.
    warnings.formatwarning = lambda message, category, *_: f"{prog}: warning: {message}\n"
    threads = blas_threads(comm.size, os.environ)
    if threads is not None and not pinned(threads, os.environ):
        # The dense products here are vectors of m or d and bundles of a few hundred
        # planes, too small to gain from BLAS threads; under MPI every core runs a rank
        # already, and OpenBLAS threads on a busy machine slow them many-fold (a
        # 16k-element dot on 2 loaded cores: 0.003 ms on one thread, 10 ms on two).
        # A serial run keeps the threads the user asks for through the environment,
        # a Slurm task the cores it was given (--cpus-per-task).
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
    try:
        check_launch(comm)
        return main(argv, comm)
    except CoordinatorError as error:
        # Raised with the other ranks (no one waits), but each party that found it says so.
        print(f"{prog}: error (party {comm.rank}): {error}", file=sys.stderr, flush=True)
        return EXIT_INPUT
    except ProtocolError as error:
        # The lowest rank but the sender speaks, and ends the job: a hostile sender may
        # neither say anything nor leave the collective it waits in.
        if comm.rank == (1 if error.sender == 0 else 0):
            print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
            if not error.agreed:
                comm.abort(EXIT_INPUT)
        return EXIT_INPUT
    except (CollectiveError, UsageError) as error:
        # Raised on every rank together: rank 0 speaks for all.
        if comm.is_root:
            print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
        return EXIT_INPUT
    except PrbmrmError as error:
        # Found by this rank alone: the others may be waiting in a collective.
        where = f" (rank {comm.rank})" if comm.size > 1 else ""
        print(f"{prog}: error{where}: {error}", file=sys.stderr, flush=True)
        if comm.size > 1:
            comm.abort(EXIT_INPUT)
        return EXIT_INPUT
    except SystemExit as exiting:
        # A rank leaving in the middle of a job (sys.exit in a plug-in, a library) would wait in
        # MPI_Finalize for the others, who wait for it: say so, and end the job with its status.
        if comm.size > 1 and exiting.code not in (0, None):
            status = exiting.code if isinstance(exiting.code, int) else EXIT_BUG
            print(f"{prog}: error: rank {comm.rank} of {comm.size} exited with status {exiting.code}: "
                  "ending the job", file=sys.stderr, flush=True)
            comm.abort(status)
        raise
    except KeyboardInterrupt:
        if comm.is_root:
            print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        if comm.size > 1:
            comm.abort(130)
        return 130
    except MemoryError as error:
        # No bug to trace: the data or the bundle does not fit this rank's memory.
        print(f"{prog}: error: rank {comm.rank} of {comm.size} ran out of memory"
              f"{f' ({error})' if str(error) else ''}", file=sys.stderr, flush=True)
        if comm.size > 1:
            comm.abort(EXIT_BUG)
        return EXIT_BUG
    except Exception:
        print(f"{prog}: internal error on rank {comm.rank}:", file=sys.stderr)
        traceback.print_exc()
        if comm.size > 1:
            comm.abort(EXIT_BUG)
        return EXIT_BUG
