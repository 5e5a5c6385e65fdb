#!/usr/bin/env bash
# A real single-node Slurm (slurmctld + slurmd + munge) in a temporary
# directory, for trying the slurm/ templates and for the tests marked `slurm`.
#
#   cluster/slurm_local.sh start DIR [CPUS]   # configure and start; prints the SLURM_CONF line
#   export SLURM_CONF=DIR/slurm.conf           # then sbatch, squeue, sacct, scontrol ... use it
#   cluster/slurm_local.sh stop DIR            # stop the daemons (DIR stays, with the logs)
#
# CPUS (default 4): virtual CPUs of the one node, whatever the machine has, and
# 64 GB of memory that Slurm only checks requests against
# (SlurmdParameters=config_overrides), so a 2-core machine runs 4-task jobs.
# Everything lives in DIR: the configuration, a munge key and socket, the
# daemons' state, logs and pid files; nothing is written to /etc or /var.
# Ports are picked free at start. Run as root (slurmd starts the jobs as
# their owners). Missing slurm-wlm or munge are installed with apt-get when
# PRBMRM_SLURM_INSTALL=1 (the tests' fixture sets it under CI only).
#
# The settings a container needs: no cgroups (proctrack/linuxproc finds a
# job's processes through /proc, task/none binds nothing), no accounting
# database (sacct reads a plain job-completion file, jobcomp/filetxt, and
# the controller's accounting_storage/none), auth/munge over DIR's socket.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR [CPUS]" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1 dir=$2 cpus=${3:-4}

stop() {
    local name pid
    # Jobs first: slurmd leaves a job's processes running when it stops.
    if [ -f "$dir/slurmctld.pid" ] && [ -f "$dir/slurm.conf" ]; then
        export SLURM_CONF=$dir/slurm.conf
        scancel --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 150); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
    for name in slurmd slurmctld munged; do
        [ -f "$dir/$name.pid" ] || continue
        pid=$(cat "$dir/$name.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/$name.pid"
    done
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ "$action" = stop ]; then stop; exit 0; fi
[ "$action" = start ] || usage
if [ "$(id -u)" != 0 ]; then echo "$0: slurmd must run as root" >&2; exit 3; fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    if [ "${PRBMRM_SLURM_INSTALL:-0}" != 1 ] || ! command -v apt-get >/dev/null; then
        echo "$0: slurm-wlm and munge are not installed (apt-get install slurm-wlm munge;" \
             "PRBMRM_SLURM_INSTALL=1 lets this script do it)" >&2
        exit 3
    fi
    # A fresh machine may have no package lists yet: update them once if the install finds nothing.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; }
fi

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
chmod 700 "$dir/munge"
host=$(hostname -s)
user=$(id -un)

# munge: its own key and socket (munged checks that nobody else may write them).
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed"

cat > "$dir/slurm.conf" <<EOF
ClusterName=prbmrm-local
# Job ids from a random start: MPICH names its shared memory after the job and
# step ids, so a run of another session must not meet a file an aborted one left.
FirstJobId=$((RANDOM * 1000 + 1000))
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
MinJobAge=600
KillWait=30
InactiveLimit=0
MessageTimeout=20
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=65536 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
export SLURM_CONF=$dir/slurm.conf

slurmctld -f "$SLURM_CONF" -i
slurmd -f "$SLURM_CONF"
# Ready when the node is idle (a few seconds: slurmd registers with the controller).
for _ in $(seq 100); do
    state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
    case "$state" in idle*) echo "SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
    sleep 0.2
done
echo "$0: the node did not become idle (state '${state:-none}'); see $dir/slurmctld.log and $dir/slurmd.log" >&2
stop
exit 1
