#!/usr/bin/env bash
# A real Slurm (slurmctld + slurmd + munge) in a temporary directory, on this
# machine alone or on NODES network-namespace hosts (cluster/netns_cluster.sh),
# for trying the slurm/ templates and for the tests marked `slurm`.
#
#   cluster/slurm_local.sh start DIR [CPUS [NODES]]  # configure and start; prints the SLURM_CONF line
#   cluster/slurm_local.sh run DIR CMD...            # a client command (sbatch, squeue, sacct ...)
#   export SLURM_CONF=DIR/slurm.conf                 # single node: then sbatch, squeue ... use it directly
#   cluster/slurm_local.sh stop DIR                  # stop the daemons (DIR stays, with the logs)
#
# CPUS (default 4): virtual CPUs of each node, whatever the machine has, and
# 64 GB of memory that Slurm only checks requests against
# (SlurmdParameters=config_overrides), so a 2-core machine runs 4-task jobs.
# NODES (default 1): with 2 or more, DIR/net holds a namespace cluster of
# NODES hosts h1..hNODES (10.77.0.11, ...) and a login node (10.77.0.1): one
# slurmd per host, in the host's namespace under the host's name, and
# slurmctld on the login node, so a job's ranks on different nodes talk TCP
# over the hosts' links (PRBMRM_SLURM_RATE, e.g. 100mbit, limits each link).
# The controller is then reachable only from inside the namespaces: `run`
# starts client commands on the login node (with one node it just sets
# SLURM_CONF). Everything lives in DIR: the configuration, a munge key and
# socket (shared by all nodes through the file system, as a cluster shares
# its key), the daemons' state, logs and pid files; nothing is written to /etc
# or /var but the namespaces' host files (/etc/netns, removed by stop). Ports
# are picked free at start. Run as root (slurmd starts the jobs as their
# owners; ip netns). Missing slurm-wlm or munge are installed with apt-get
# when PRBMRM_SLURM_INSTALL=1 (the tests' fixture sets it under CI only).
#
# The settings a container needs: no cgroups (proctrack/linuxproc finds a
# job's processes through /proc, task/none binds nothing), no accounting
# database (sacct reads a plain job-completion file, jobcomp/filetxt, and
# the controller's accounting_storage/none), auth/munge over DIR's socket.
set -euo pipefail

usage() { echo "usage: $0 start DIR [CPUS [NODES]] | run DIR CMD... | stop DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1 dir=$2
NETNS=$(cd "$(dirname "$0")" && pwd)/netns_cluster.sh

# run CMD...: on the login node of a namespace cluster, else here; with this Slurm's configuration.
run() {
    if [ -f "$dir/net/prefix" ]; then
        # The login node's environment, as a site's module sets it (sbatch passes it on to the job):
        # the ranks' data over TCP on the hosts' eth0, through libfabric (MPICH's ofi netmod). Not
        # UCX, the wheel's default: its address exchange in MPI_Init puts values of about 1 KB
        # through PMI (the wheel speaks the PMI-1 wire protocol to Slurm's mpi/pmi2 plugin), and
        # Slurm 22.05 misreads such lines when their run-length encoding does not shorten them:
        # "mpi/pmi2: value not properly terminated in client request", then MPI_Init fails or
        # hangs (3 of 8 multi-node jobs here; 0 of 6 with ofi). OFI's addresses are short.
        MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=eth0 UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 \
            SLURM_CONF=$dir/slurm.conf bash "$NETNS" exec "$dir/net" login "$@"
    else
        SLURM_CONF=$dir/slurm.conf "$@"
    fi
}

stop() {
    local name pid
    # Jobs first: slurmd leaves a job's processes running when it stops. A task that ignores
    # SIGTERM is killed KillWait (30 s) after it, so wait longer than that for the queue to empty.
    if [ -f "$dir/slurmctld.pid" ] && [ -f "$dir/slurm.conf" ]; then
        run scancel --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 300); do
            [ -z "$(run squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
    for name in "$dir"/slurmd*.pid "$dir/slurmctld.pid" "$dir/munged.pid"; do
        [ -f "$name" ] || continue
        pid=$(cat "$name")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$name"
    done
    bash "$NETNS" down "$dir/net"   # nothing to do without one
}

# Two free ports at once (both sockets open together, so they differ), for slurmctld and slurmd.
free_ports() {
    python3 -c 'import socket; s = [socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]; print(*(x.getsockname()[1] for x in s))'
}

if [ "$action" = stop ]; then stop; exit 0; fi
if [ "$action" = run ]; then shift 2; [ $# -ge 1 ] || usage; run "$@"; exit; fi
[ "$action" = start ] || usage
cpus=${3:-4} nodes=${4:-1}
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
user=$(id -un)
trap 'stop' ERR   # a half-started Slurm is stopped
if [ "$nodes" -gt 1 ]; then
    bash "$NETNS" up "$dir/net" "$nodes" ${PRBMRM_SLURM_RATE:-} >/dev/null
    ctld="login(10.77.0.1)"
    names="h[1-$nodes]"
    node_lines=$(for i in $(seq "$nodes"); do
        echo "NodeName=h$i NodeAddr=10.77.0.$((10 + i)) CPUs=$cpus RealMemory=65536 State=UNKNOWN"; done)
else
    names=$(hostname -s)
    ctld="$names(127.0.0.1)"
    node_lines="NodeName=$names NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=65536 State=UNKNOWN"
fi

read -r ctld_port slurmd_port < <(free_ports)

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
SlurmctldHost=$ctld
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
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
$node_lines
PartitionName=debug Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF

if [ "$nodes" -gt 1 ]; then
    # Each daemon in its node's namespace, under the node's host name (slurmd finds its NodeName so).
    bash "$NETNS" exec "$dir/net" login slurmctld -f "$dir/slurm.conf" -i
    for i in $(seq "$nodes"); do bash "$NETNS" exec "$dir/net" "h$i" slurmd -f "$dir/slurm.conf"; done
else
    slurmctld -f "$dir/slurm.conf" -i
    slurmd -f "$dir/slurm.conf"
fi
# Ready when every node is idle (a few seconds: each slurmd registers with the controller).
for _ in $(seq 150); do
    states=$(run sinfo -h -N -o %t 2>/dev/null | sort -u | paste -sd' ' || true)
    case "$states" in idle) echo "SLURM_CONF=$dir/slurm.conf"; exit 0 ;; esac
    sleep 0.2
done
echo "$0: the nodes did not become idle (states '${states:-none}'); see $dir/slurmctld.log and $dir/slurmd-*.log" >&2
stop
exit 1
