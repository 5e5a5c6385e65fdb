#!/bin/bash
# A real multi-host MPI job on ONE Linux machine: every "host" is a network
# namespace with its own interface, address and host name (netns_cluster.sh),
# so the ranks talk TCP over a (virtual) network exactly as on a cluster, and
# the launch goes through hydra's remote-launch path (a proxy started per host).
#
#     sudo cluster/netns_multihost.sh [prbmrm.train options]
#     sudo HOSTS=3 PPN=2 RATE=100mbit cluster/netns_multihost.sh --data shards/ --loss logistic
#
# HOSTS (default 2) hosts of PPN (default 1) ranks each; RATE (tc units,
# default none) limits every host's link. Needs root (ip netns), iproute2
# and util-linux (unshare); no ssh server (netns_cluster.sh says how).
# The ranks run the prbmrm that `python -c 'import prbmrm'` finds: the
# installed package; PYTHONPATH=CHECKOUT runs a checkout instead (mpiexec
# passes the environment on to every host). The launch is the one the docs
# recommend: `mpiexec -f HOSTFILE -n P python -m prbmrm.train ...`.
# Prints where each rank ran, trains, prints the bytes each host's eth0
# moved, and checks the model against a 1-process run, bit for bit. Every
# namespace is removed on exit; each step has a deadline (TIMEOUT s, default 600).

set -euo pipefail

HOSTS=${HOSTS:-2}
PPN=${PPN:-1}
RATE=${RATE:-}
TIMEOUT=${TIMEOUT:-600}
HERE=$(cd "$(dirname "$0")" && pwd)
NETNS=$HERE/netns_cluster.sh

# The environment every rank gets (mpiexec passes its own on): the venv of
# PRBMRM_VENV if set (else the Python on PATH), one thread per rank.
. "$HERE/env.sh"
PYTHON=$(command -v python3 || command -v python)

[ "$(id -u)" = 0 ] || { echo "netns_multihost.sh: needs root (ip netns add)" >&2; exit 1; }
[ "$HOSTS" -ge 2 ] && [ "$HOSTS" -le 200 ] || { echo "netns_multihost.sh: HOSTS must be 2..200" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'bash "$NETNS" down "$WORK/net"; rm -rf "$WORK"' EXIT
bash "$NETNS" up "$WORK/net" "$HOSTS" $RATE >/dev/null
for h in $(seq -f "h%g" 1 "$HOSTS"); do echo "$h:$PPN"; done > "$WORK/hostfile"
ranks=$((HOSTS * PPN))
run_mpi() { timeout "$TIMEOUT" bash "$NETNS" mpiexec "$WORK/net" -f "$WORK/hostfile" -n "$ranks" "$@"; }

echo "== $HOSTS hosts x $PPN rank(s)${RATE:+, links at $RATE}, mpiexec on 'login'" \
     "($("$PYTHON" -m mpi4py --mpi-lib-version 2>/dev/null | sed -n 1p | tr -s ' '))"
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

before=$(bash "$NETNS" bytes "$WORK/net")
echo "== mpiexec -f hostfile -n $ranks python -m prbmrm.train --out model.h5${*:+ $*}"
run_mpi "$PYTHON" -m prbmrm.train --out "$WORK/model.h5" "$@"
paste <(echo "$before") <(bash "$NETNS" bytes "$WORK/net") |
    while read -r h rx0 tx0 _ rx1 tx1; do
        echo "$h eth0 during training: received $((rx1 - rx0)) bytes, sent $((tx1 - tx0)) bytes"
    done

echo "== the same training on 1 process (no MPI launcher)"
timeout "$TIMEOUT" "$PYTHON" -m prbmrm.train --quiet --out "$WORK/serial.h5" "$@"
"$PYTHON" - "$WORK/model.h5" "$WORK/serial.h5" "$HOSTS" <<'PY'
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
PY
