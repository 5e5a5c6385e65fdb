# The environment prbmrm runs in on a cluster. Source it, don't execute it:
#
#     PRBMRM_VENV=/shared/venvs/prbmrm . cluster/env.sh
#
# on the node you start mpiexec from (hydra's mpiexec passes its whole
# environment on to every rank on every host, so the other hosts need nothing
# but the same paths), or at the top of a batch script (srun passes the batch
# script's environment on to its tasks).
#
# PRBMRM_VENV: a virtual environment on storage every node mounts at the same
# path (cluster/README.md says how to make one). Unset: keep the Python
# already on PATH, e.g. a venv you activated yourself.

if [ -n "${PRBMRM_VENV:-}" ]; then
    if [ ! -f "$PRBMRM_VENV/bin/activate" ]; then
        echo "cluster/env.sh: PRBMRM_VENV=$PRBMRM_VENV is not a virtual environment (no bin/activate)" >&2
        return 1 2>/dev/null || exit 1   # 'return' when sourced, 'exit' if run by mistake
    fi
    # Puts the venv's python, mpiexec and hydra_pmi_proxy first on PATH.
    . "$PRBMRM_VENV/bin/activate"
fi

# One thread per rank: the ranks already fill the cores, and BLAS or OpenMP
# threads on top would oversubscribe them (prbmrm.train also limits the BLAS
# pools of a multi-rank run itself; these cover every library from the start).
export OMP_NUM_THREADS=1
export OPENBLAS_NUM_THREADS=1
export MKL_NUM_THREADS=1
export BLIS_NUM_THREADS=1

# HDF5 locks every file it opens, and some shared file systems (NFS without a
# lock daemon, some Lustre mounts) refuse the lock: opening a shard then fails
# with "unable to lock file". Shards are only read, the model is written once.
export HDF5_USE_FILE_LOCKING=FALSE
