#!/bin/bash
# A virtual cluster on ONE Linux machine: every "host" is a network namespace
# with its own interface, address and host name, its link to the others
# optionally limited by a token-bucket filter, so MPI ranks (and slurmd, see
# slurm_netns.sh) talk TCP over a network exactly as on a cluster.
#
#   cluster/netns_cluster.sh up DIR HOSTS [RATE]   # build it; RATE e.g. 100mbit, 1gbit (default: none)
#   cluster/netns_cluster.sh mpiexec DIR ARGS...   # hydra's mpiexec on the login node, one proxy per host
#   cluster/netns_cluster.sh exec DIR HOST CMD...  # CMD on HOST (login, h1, h2, ...)
#   cluster/netns_cluster.sh bytes DIR             # "HOST RX TX" of every host's eth0
#   cluster/netns_cluster.sh down DIR              # kill what runs inside, remove it all
#
# Needs root (ip netns), iproute2 (ip, tc) and util-linux (unshare).
# Layout, all inside namespaces created here (the machine's own network and
# addresses are not touched):
#
#   namespace PREFIX-login  bridge br0 10.77.0.1/24 (mpiexec, slurmctld: the login node)
#   namespace PREFIX-h1     eth0 10.77.0.11/24, host name h1   --.
#   namespace PREFIX-h2     eth0 10.77.0.12/24, host name h2   --+-- veth cables on br0
#   ...
#
# RATE limits each host's cable in both directions (tc tbf on eth0 for what
# the host sends, on the bridge's end for what it receives), like a switch
# port of that speed. This kernel's tc has no netem, so no latency is added:
# count the messages on the critical path instead.
#
# There is no ssh server: hydra's ssh launcher is pointed (-launcher-exec) at
# DIR/netns-ssh, which runs hydra_pmi_proxy inside the host's namespace with
# `ip netns exec`, in its own UTS namespace with the host's name. The
# namespaces share the file system, which plays the shared storage.
# DIR keeps the state: the namespace prefix, the host list, a hydra host file
# (DIR/hostfile, "hN:1" lines) and the shim. `down` is safe to repeat.
set -euo pipefail

usage() { echo "usage: $0 up DIR HOSTS [RATE] | mpiexec DIR ARGS... | exec DIR HOST CMD... | bytes DIR | down DIR" >&2
          exit 2; }
[ $# -ge 2 ] || usage
action=$1 dir=$2
shift 2

in_ns() { local ns=$1; shift; ip netns exec "$PREFIX-$ns" "$@"; }
load() {
    [ -f "$dir/prefix" ] || { echo "$0: $dir holds no namespace cluster (no $dir/prefix)" >&2; exit 1; }
    PREFIX=$(cat "$dir/prefix")
    hosts=$(cat "$dir/hosts")
}

down() {
    [ -f "$dir/prefix" ] || return 0
    load
    local ns
    for ns in login $hosts; do
        # Only processes inside our own namespaces (a proxy or daemon left by a failed run).
        ip netns pids "$PREFIX-$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$PREFIX-$ns" 2>/dev/null || true   # also deletes its interfaces and qdiscs
        rm -rf "/etc/netns/$PREFIX-$ns"
    done
    rmdir /etc/netns 2>/dev/null || true   # only if nothing else uses it
    rm -f "$dir/prefix"
}

case "$action" in
up)
    [ $# -ge 1 ] || usage
    count=$1 rate=${2:-}
    [ "$(id -u)" = 0 ] || { echo "$0: needs root (ip netns add)" >&2; exit 3; }
    command -v ip >/dev/null && command -v tc >/dev/null && command -v unshare >/dev/null || {
        echo "$0: needs iproute2 (ip, tc) and util-linux (unshare): apt-get install iproute2 util-linux" >&2
        exit 3; }
    [ "$count" -ge 1 ] && [ "$count" -le 200 ] || { echo "$0: HOSTS must be 1..200" >&2; exit 2; }
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ ! -f "$dir/prefix" ] || { echo "$0: $dir already holds a cluster ($0 down $dir first)" >&2; exit 1; }
    # Short (interface and namespace names) and apart from other runs' clusters.
    PREFIX=pbm$$
    hosts=$(seq -f "h%g" 1 "$count")
    echo "$PREFIX" > "$dir/prefix"
    echo "$hosts" > "$dir/hosts"
    trap 'down' ERR   # a half-built cluster is removed
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
        if [ -n "$rate" ]; then
            # burst: 64 KB (5 ms at 100 Mbit/s), so a full TCP segment passes; latency: the queue a
            # sender may build before drops, long enough that TCP does not collapse.
            in_ns "$h" tc qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 100ms
            in_ns login tc qdisc add dev "$h" root tbf rate "$rate" burst 64kb latency 100ms
        fi
        hosts_file+=$'\n'"10.77.0.$((10 + i)) $h"
    done
    # Name resolution: `ip netns exec NS` bind-mounts /etc/netns/NS/hosts over /etc/hosts.
    for ns in login $hosts; do
        mkdir -p "/etc/netns/$PREFIX-$ns"
        echo "$hosts_file" > "/etc/netns/$PREFIX-$ns/hosts"
    done
    for h in $hosts; do echo "$h:1"; done > "$dir/hostfile"
    # hydra's ssh launcher runs `LAUNCHER -x HOST "hydra_pmi_proxy" --control-port login:PORT ...`.
    cat > "$dir/netns-ssh" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done    # drop ssh options (-x)
host=\$1; shift
# Its own UTS namespace gives the host its own name, as a real machine has.
exec ip netns exec "$PREFIX-\$host" unshare --uts sh -c "hostname \$host && exec \$*"
EOF
    chmod +x "$dir/netns-ssh"
    trap - ERR
    echo "$count hosts (h1..h$count) in namespaces $PREFIX-*${rate:+, each link $rate}; hydra host file $dir/hostfile"
    ;;
mpiexec)
    load
    # The mpiexec next to the Python on PATH (the mpich wheel's; a venv with
    # --system-site-packages has it only on PATH).
    python=$(command -v python3 || command -v python)
    launcher=$(dirname "$("$python" -c 'import sys; print(sys.executable)')")/mpiexec
    [ -x "$launcher" ] || launcher=$(command -v mpiexec) || { echo "$0: no mpiexec" >&2; exit 1; }
    # UCX, the wheel's netmod, would move data between processes of one
    # machine through shared memory even across namespaces: TCP over eth0
    # only. On a real cluster keep UCX's transports and only name the
    # interface (cluster/README.md).
    export UCX_TLS=tcp,self UCX_NET_DEVICES=eth0
    export FI_PROVIDER=tcp FI_TCP_IFACE=eth0             # the same for MPIR_CVAR_CH4_NETMOD=ofi
    # The login node runs mpiexec under its own host name, which the hosts resolve.
    exec ip netns exec "$PREFIX-login" unshare --uts sh -c 'hostname login && exec "$@"' sh \
        "$launcher" -launcher ssh -launcher-exec "$dir/netns-ssh" "$@"
    ;;
exec)
    load
    [ $# -ge 2 ] || usage
    host=$1; shift
    # `ip netns exec` mounts a fresh /sys (showing the namespace's own interfaces), which hides the
    # cgroup file systems slurmd insists on: mount the same hierarchies again, in its mount namespace.
    exec ip netns exec "$PREFIX-$host" unshare --uts sh -c '
        grep " /sys/fs/cgroup" /proc/1/mounts | while read -r source target type options _; do
            mkdir -p "$target" 2>/dev/null; mount -t "$type" -o "$options" "$source" "$target" 2>/dev/null || true
        done
        hostname "$0" && exec "$@"' "$host" "$@"
    ;;
bytes)
    load
    for h in $hosts; do
        echo "$h $(in_ns "$h" cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes |
                   paste -sd' ')"
    done
    ;;
down) down ;;
*) usage ;;
esac
