"""Build BMRM 2.1, the authors' C++ code, for the benchmarks that run it side by side with prbmrm.

The sources are ``../shared/peers/bmrm21-*.tar.xz`` (relative to the
repository); nothing of the peer is kept in the repository. Used by
``bench_peers.py`` and ``bench_highdim.py``; both also accept ``--peer-dir``
to reuse an existing build.
"""

import shutil
import subprocess
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TIMEOUT = 3600


def build_peer(work, mpi=False):
    """Build BMRM 2.1's trainer (``mpi``: the parallel one) under `work`; return its directory or None.

    None when the compiler (``g++``, ``mpicxx`` for the parallel trainer) or
    the archive is missing. The directory holds ``linear-bmrm-train`` (or
    ``parallel-bmrm-train``).
    """
    compiler = "mpicxx" if mpi else "g++"
    archives = sorted((SHARED / "peers").glob("bmrm21-*.tar.xz"))
    if shutil.which(compiler) is None or not archives:
        return None
    target = Path(work) / ("peer-mpi" if mpi else "peer")
    target.mkdir()
    subprocess.run(["tar", "-xJf", str(archives[-1]), "-C", str(target)], check=True, stdin=subprocess.DEVNULL)
    make = ["make", "-C", str(target / "linear-bmrm"), "all"]
    if mpi:
        make[3:3] = ["MPI_AVAILABLE=1", "CXX=mpicxx"]
    subprocess.run(make, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   stdin=subprocess.DEVNULL, timeout=TIMEOUT)
    return target / "linear-bmrm"
