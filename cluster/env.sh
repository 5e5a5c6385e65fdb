# The environment prbmrm runs in on a cluster. Source it, don't execute it:
#
#     PRBMRM_VENV=/shared/venvs/prbmrm . cluster/env.sh
#
# on the node you start mpiexec from (hydra's mpiexec passes its whole
# environment on to every rank on every host, so the other hosts need nothing
# but the same paths), or at the top of a batch script (srun passes the batch
# script's environment on to its tasks); the slurm/ templates source it from
# $PRBMRM_HOME/cluster/env.sh.
#
# PRBMRM_VENV: a virtual environment on storage every node mounts at the same
# path (cluster/README.md says how to make one). Unset: keep the Python
# already on PATH, e.g. a venv you activated yourself.
# PRBMRM_SRUN_MPI: the srun --mpi plugin (prbmrm_step below); unset: chosen
# from the MPI library mpi4py loads.

if [ -n "${PRBMRM_VENV:-}" ]; then
    if [ ! -f "$PRBMRM_VENV/bin/activate" ]; then
        echo "cluster/env.sh: PRBMRM_VENV=$PRBMRM_VENV is not a virtual environment (no bin/activate)" >&2
        return 1 2>/dev/null || exit 1   # 'return' when sourced, 'exit' if run by mistake
    fi
    # Puts the venv's python, mpiexec and hydra_pmi_proxy first on PATH.
    . "$PRBMRM_VENV/bin/activate"
fi

# Threads per rank: the cores Slurm gives each task (--cpus-per-task), else one:
# the ranks already fill the cores, and BLAS or OpenMP threads beyond them
# would oversubscribe them (prbmrm.cli.train limits the BLAS pools to this count).
threads=${SLURM_CPUS_PER_TASK:-1}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads BLIS_NUM_THREADS=$threads
unset threads

# HDF5 locks every file it opens, and some shared file systems (NFS without a
# lock daemon, some Lustre mounts) refuse the lock: opening a shard then fails
# with "unable to lock file". Shards are only read, the model is written once.
export HDF5_USE_FILE_LOCKING=FALSE

# ---- under Slurm: the srun step of a batch script (slurm/*.sbatch) ----

# The srun --mpi plugin that mpi4py's MPI library speaks: the mpich wheel
# (`pip install prbmrm` brings it), MVAPICH2 and Intel MPI speak PMI-1/PMI-2
# (pmi2), Open MPI 5 only PMIx (pmix). PRBMRM_SRUN_MPI overrides the choice.
prbmrm_srun_mpi() {
    local library plugin
    library=$(python -m mpi4py --mpi-lib-version 2>/dev/null | sed -n 1p)
    case "$library" in
        *"Open MPI"*) plugin=pmix ;;
        *MPICH*|*MVAPICH*|*"Intel(R) MPI"*) plugin=pmi2 ;;
        *) plugin=pmix ;;
    esac
    plugin=${PRBMRM_SRUN_MPI:-$plugin}
    case "$library/$plugin" in
        *MPICH*/pmix|*MVAPICH*/pmix)
            echo "prbmrm: PRBMRM_SRUN_MPI=pmix, but mpi4py's MPI ($library) speaks PMI-1/PMI-2, not PMIx:" \
                 "every rank would abort in MPI_Init; use PRBMRM_SRUN_MPI=pmi2" >&2
            return 1 ;;
        *"Open MPI"*/none|*MPICH*/none)
            echo "prbmrm: PRBMRM_SRUN_MPI=none starts every task as its own 1-rank MPI job ($library)" >&2
            return 1 ;;
    esac
    if ! srun --mpi=list 2>&1 | grep -qw -- "$plugin"; then
        echo "prbmrm: this cluster's srun has no --mpi=$plugin plugin, which mpi4py's MPI ($library) needs;" \
             "srun --mpi=list shows: $(srun --mpi=list 2>&1 | tail -n +2 | tr -s ' \t\n' ' ')" \
             "(set PRBMRM_SRUN_MPI, or build mpi4py against the site's MPI: cluster/README.md)" >&2
        return 1
    fi
    echo "$plugin"
}

# The default checkpoint of this job (of this array task): a requeued job
# finds it again, and prbmrm.cli.train --resume-if-exists continues from it.
if [ -n "${SLURM_JOB_ID:-}" ]; then
    PRBMRM_JOB_CHECKPOINT=prbmrm-${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID}.ckpt.h5
fi

# MPICH names its shared-memory file (/dev/shm/mpich_shm_*) after the job and
# step ids, which a requeued job reuses: a file that an aborted run left behind
# would be attached again and break MPI_Init ("Message truncated"). On every
# node of the job, remove this user's such files older than a minute that no
# process has mapped or open (an MPI job running there keeps its own).
prbmrm_clean_shm() {
    srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --mpi=none bash -c '
        used=$(cat /proc/[0-9]*/maps 2>/dev/null; ls -l /proc/[0-9]*/fd 2>/dev/null)
        find /dev/shm -maxdepth 1 -name "mpich_shm_*" -user "$(id -un)" -mmin +1 | while read -r f; do
            grep -qF "$f" <<< "$used" || { rm -f "$f" && echo "prbmrm: removed a stale $f"; }
        done'
}

# prbmrm_step COMMAND...: run COMMAND as one srun step, one MPI rank per task.
# --kill-on-bad-exit=1: a rank that dies ends the step at once. SIGUSR1 to
# the batch shell (sbatch --signal=B:USR1@SECONDS, before the time limit or
# a preemption) is passed to the step, whose ranks then checkpoint and stop
# cleanly (MPI_Finalize on every rank, status 138 = 128 + SIGUSR1); the job is
# then requeued, and the requeued job continues from the checkpoint
# (--resume-if-exists). A step that ends otherwise (it finished before the
# signal mattered: status 0; or failed) is not requeued.
prbmrm_step() {
    local plugin step status
    plugin=$(prbmrm_srun_mpi) || return 1
    if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then prbmrm_clean_shm; fi
    _prbmrm_requeue=0
    srun --mpi="$plugin" --kill-on-bad-exit=1 "$@" &
    step=$!
    trap 'echo "prbmrm: SIGUSR1: the step checkpoints and stops, and the job is requeued if it stopped" >&2
          _prbmrm_requeue=1; kill -USR1 '"$step"' 2>/dev/null || true' USR1
    while :; do
        status=0
        wait "$step" || status=$?
        kill -0 "$step" 2>/dev/null || break  # else the trap interrupted the wait
    done
    trap - USR1
    if [ "$_prbmrm_requeue" = 1 ] && [ "$status" != 138 ]; then
        echo "prbmrm: SIGUSR1 came, but the step ended with status $status, not 138 (stopped by it): no requeue" >&2
    fi
    if [ "$_prbmrm_requeue" = 1 ] && [ "$status" = 138 ]; then
        echo "prbmrm: step ended with status $status; requeueing job $SLURM_JOB_ID" >&2
        scontrol requeue "$SLURM_JOB_ID"
    fi
    return "$status"
}
