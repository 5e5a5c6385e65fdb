#!/bin/bash
# A real multi-host MPI job on ONE Linux machine: every "host" is a network
# namespace with its own interface, address and host name, so the ranks talk
# TCP over a (virtual) network exactly as on a cluster, and the launch goes
# through hydra's remote-launch path (a proxy started per host).
#
#     sudo cluster/netns_multihost.sh [prbmrm.cli.train options]
#     sudo HOSTS=3 PPN=2 cluster/netns_multihost.sh --data shards/ --loss logistic
#
# Needs root (ip netns), iproute2 and util-linux (unshare), and no ssh server:
# hydra's ssh launcher is pointed at a small shim that runs hydra_pmi_proxy in
# the host's namespace with `ip netns exec` (hydra's `-launcher manual`, which
# prints the proxy command lines for you to start by hand, works too).
#
# Layout, all inside namespaces (the machine's own network is not touched):
#
#   namespace PREFIX-login  bridge br0 10.77.0.1/24, runs mpiexec (the login node)
#   namespace PREFIX-h1     eth0 10.77.0.11/24, host name h1   --.
#   namespace PREFIX-h2     eth0 10.77.0.12/24, host name h2   --+-- veth ports on br0
#   ...
#
# The namespaces share the file system, which plays the shared storage: the
# same Python and the same checkout at the same paths on every host.
# Prints where each rank ran, trains prbmrm on HOSTS x PPN ranks, the bytes
# each host's eth0 moved, and checks the model against a 1-process run.

set -euo pipefail

HOSTS=${HOSTS:-2}                  # number of "hosts"
PPN=${PPN:-1}                      # ranks per host
PREFIX=prbmrm$$                    # namespace names; the PID keeps parallel runs apart
REPO=$(cd "$(dirname "$0")/.." && pwd)

# The environment every rank gets (mpiexec passes its own on): the venv of
# PRBMRM_VENV if set (else the Python on PATH), one thread per rank.
. "$REPO/cluster/env.sh"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's prbmrm on every host
PYTHON=$(command -v python3 || command -v python)
# The mpich wheel puts mpiexec next to the interpreter (a venv with
# --system-site-packages has it only on PATH).
MPIEXEC=$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")/mpiexec
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec) || { echo "netns_multihost.sh: no mpiexec" >&2; exit 1; }

[ "$(id -u)" = 0 ] || { echo "netns_multihost.sh: needs root (ip netns add)" >&2; exit 1; }
[ "$HOSTS" -ge 2 ] && [ "$HOSTS" -le 200 ] || { echo "netns_multihost.sh: HOSTS must be 2..200" >&2; exit 1; }

WORK=$(mktemp -d)
hosts=$(seq -f "h%g" 1 "$HOSTS")

cleanup() {
    for ns in login $hosts; do
        # Only processes inside our own namespaces (a proxy left by a failed run).
        ip netns pids "$PREFIX-$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$PREFIX-$ns" 2>/dev/null || true   # also deletes its interfaces
        rm -rf "/etc/netns/$PREFIX-$ns"
    done
    rmdir /etc/netns 2>/dev/null || true   # only if nothing else uses it
    rm -rf "$WORK"
}
trap cleanup EXIT

in_ns() { local ns=$1; shift; ip netns exec "$PREFIX-$ns" "$@"; }

# ---- the network: a bridge in the login namespace, one veth cable per host ----
ip netns add "$PREFIX-login"
in_ns login ip link set lo up
in_ns login ip link add br0 type bridge
in_ns login ip addr add 10.77.0.1/24 dev br0
in_ns login ip link set br0 up
hosts_file="127.0.0.1 localhost
10.77.0.1 login"
i=0
for h in $hosts; do
    i=$((i + 1))
    ip netns add "$PREFIX-$h"
    # One cable: end "$h" on the bridge, end "eth0" in the host.
    ip link add "$h" netns "$PREFIX-login" type veth peer name eth0 netns "$PREFIX-$h"
    in_ns login ip link set "$h" master br0
    in_ns login ip link set "$h" up
    in_ns "$h" ip link set lo up
    in_ns "$h" ip addr add "10.77.0.$((10 + i))/24" dev eth0
    in_ns "$h" ip link set eth0 up
    hosts_file+=$'\n'"10.77.0.$((10 + i)) $h"
done
# Name resolution: `ip netns exec NS` bind-mounts /etc/netns/NS/hosts over /etc/hosts.
for ns in login $hosts; do
    mkdir -p "/etc/netns/$PREFIX-$ns"
    echo "$hosts_file" > "/etc/netns/$PREFIX-$ns/hosts"
done

# ---- the "ssh" hydra uses: run the command in the host's namespace ----
# hydra's ssh launcher runs `LAUNCHER -x HOST "hydra_pmi_proxy" --control-port login:PORT ...`.
cat > "$WORK/netns-ssh" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done    # drop ssh options (-x)
host=\$1; shift
# Its own UTS namespace gives the host its own name, as a real machine has.
exec ip netns exec "$PREFIX-\$host" unshare --uts sh -c "hostname \$host && exec \$*"
EOF
chmod +x "$WORK/netns-ssh"

# hydra's host file: one "host:ranks" line per host.
for h in $hosts; do echo "$h:$PPN"; done > "$WORK/hostfile"

# ---- the network the ranks use ----
# MPICH's default netmod, UCX, would move data between processes of one machine
# through shared memory even across namespaces: allow TCP only. On a cluster
# keep UCX's default transports and only name the interface (UCX_NET_DEVICES).
export UCX_TLS=tcp,self UCX_NET_DEVICES=eth0
export FI_PROVIDER=tcp FI_TCP_IFACE=eth0             # the same for MPIR_CVAR_CH4_NETMOD=ofi

ranks=$((HOSTS * PPN))
mpiexec=("$MPIEXEC" -f "$WORK/hostfile" -launcher ssh -launcher-exec "$WORK/netns-ssh" -n "$ranks")
run_mpi() {
    # The login node starts mpiexec under its own host name, which the hosts resolve.
    in_ns login unshare --uts sh -c 'hostname login && exec "$@"' sh timeout 600 "${mpiexec[@]}" "$@"
}
eth0_bytes() { in_ns "$1" cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes | paste -sd' '; }

echo "== $HOSTS hosts x $PPN rank(s), mpiexec on 'login' ($("$PYTHON" -m mpi4py --mpi-lib-version | sed -n 1p | tr -s ' '))"
echo "hostfile: $(paste -sd' ' "$WORK/hostfile")"
run_mpi "$PYTHON" -c '
import os, socket, sys, prbmrm
from mpi4py import MPI
c = MPI.COMM_WORLD
host = MPI.Get_processor_name()
line = (f"rank {c.rank} of {c.size} on host {host} ({socket.gethostbyname(host)}): "
        f"{sys.executable}, prbmrm in {os.path.dirname(prbmrm.__file__)}")
lines = c.gather(line)  # rank 0 prints them all: output of several ranks may interleave
if c.rank == 0:
    print("\n".join(lines))
'

declare -A before
for h in $hosts; do before[$h]=$(eth0_bytes "$h"); done
echo "== python -m mpi4py -m prbmrm.cli.train --out $WORK/model.h5${*:+ $*} on $ranks ranks"
run_mpi "$PYTHON" -m mpi4py -m prbmrm.cli.train --out "$WORK/model.h5" "$@"
for h in $hosts; do
    read -r rx0 tx0 <<< "${before[$h]}"
    read -r rx1 tx1 <<< "$(eth0_bytes "$h")"
    echo "$h eth0 during training: received $((rx1 - rx0)) bytes, sent $((tx1 - tx0)) bytes"
done

echo "== the same training on 1 process (no MPI launcher)"
"$PYTHON" -m prbmrm.cli.train --quiet --out "$WORK/serial.h5" "$@"
"$PYTHON" - "$WORK/model.h5" "$WORK/serial.h5" "$HOSTS" <<'EOF'
import sys
import numpy as np
from prbmrm.model import load_model
spread, serial = load_model(sys.argv[1]), load_model(sys.argv[2])
for name, model in ((f"{spread.attrs['ranks']} ranks on {sys.argv[3]} hosts", spread), ("1 process", serial)):
    print(f"{name}: objective {model.attrs['objective']:.15g}, {model.attrs['iterations']} iterations")
# Sums over examples are exact in fixed point, so any split gives the same path, bit for bit.
same = np.array_equal(spread.w, serial.w) and spread.attrs["iterations"] == serial.attrs["iterations"]
print(f"weights bitwise identical: {same}")
sys.exit(0 if same else 1)
EOF
