"""Several hosts on one machine: network-namespace hosts (cluster/netns_cluster.sh) and mpiexec over them.

Each host is a network namespace with its own eth0, address and host name;
hydra starts a proxy "on" each (cluster/netns_multihost.sh), the ranks talk
TCP over the hosts' links, limited by a token-bucket filter. Skipped, with
the reason, without root, iproute2/util-linux or network namespaces.
"""

import os
import re
import subprocess
import sys

import pytest

from helpers import REPO, skip_without_network_namespaces

# Namespace and host names are host-wide: these tests and the Slurm ones run on one xdist worker.
pytestmark = pytest.mark.xdist_group("host")

CLUSTER = os.path.join(REPO, "cluster", "netns_cluster.sh")
MULTIHOST = os.path.join(REPO, "cluster", "netns_multihost.sh")


def namespaces():
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, check=True)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def netns():
    """Skips unless this process may make network namespaces; the environment the scripts run in."""
    if os.geteuid() != 0:
        pytest.skip("network-namespace hosts need root (ip netns add)")
    skip_without_network_namespaces()
    # The checkout under test on every host (mpiexec passes the environment on).
    return dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
                PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))


@pytest.mark.parametrize("hosts", [2, 3])
def test_mpiexec_over_namespace_hosts_equals_one_process(netns, hosts):
    before = namespaces()
    done = subprocess.run(["bash", MULTIHOST, "--lam", "1e-3", "--quiet"], capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL,
                          env=dict(netns, HOSTS=str(hosts), RATE="100mbit", TIMEOUT="300"))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # One rank on each host, each under its own name and address.
    for rank in range(hosts):
        assert f"rank {rank} of {hosts} on host h{rank + 1} (10.77.0.{11 + rank})" in out, out
    assert f"mpiexec -f hostfile -n {hosts} python -m prbmrm.train" in out
    iterations = int(re.search(r"(\d+) ranks on \d+ hosts: objective \S+, (\d+) iterations", out).group(2))
    sent = [int(n) for n in re.findall(r"h\d+ eth0 during training: received \d+ bytes, sent (\d+) bytes", out)]
    # Every rank sends its part of every iteration's sums over its host's link.
    assert len(sent) == hosts and min(sent) >= iterations, out
    assert "weights bitwise identical: True" in out
    assert namespaces() <= before, "namespaces left behind"


def test_the_cluster_script_refuses_a_bad_count_and_removes_what_it_made(netns, tmp_path):
    before = namespaces()
    done = subprocess.run(["bash", CLUSTER, "up", str(tmp_path / "net"), "0"], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "HOSTS must be 1..200" in done.stderr
    up = subprocess.run(["bash", CLUSTER, "up", str(tmp_path / "net"), "2", "100mbit"], capture_output=True,
                        text=True, timeout=120, stdin=subprocess.DEVNULL)
    try:
        assert up.returncode == 0, up.stderr
        qdisc = subprocess.run(["bash", CLUSTER, "exec", str(tmp_path / "net"), "h1", "tc", "qdisc", "show",
                                "dev", "eth0"], capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL)
        assert re.search(r"qdisc tbf .* rate 100Mbit", qdisc.stdout), qdisc.stdout + qdisc.stderr
        name = subprocess.run(["bash", CLUSTER, "exec", str(tmp_path / "net"), "h2", "hostname"],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert name.stdout.strip() == "h2"
        assert len(namespaces() - before) == 3  # the login node and two hosts
    finally:
        subprocess.run(["bash", CLUSTER, "down", str(tmp_path / "net")], timeout=120, stdin=subprocess.DEVNULL)
    assert namespaces() <= before, "namespaces left behind"


def test_bench_scale_runs_on_namespace_hosts_and_checks_the_models(netns, tmp_path):
    """scripts/bench_scale.py end to end on 2 hosts: its table, and every model bitwise the 1-process one."""
    before = namespaces()
    done = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_scale.py"), "--ranks", "2",
                           "--where", "local", "netns", "--rate", "100mbit", "--rows", "400", "--log-dim", "12",
                           "--shards", "2", "--iterations", "3", "--json", str(tmp_path / "figures.json")],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, env=netns)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every model bitwise equal to the 1-process one: True" in done.stdout, done.stdout
    # The first table, a row per run (the medians over rounds follow it, after a blank line).
    runs = done.stdout[done.stdout.index("\n|"):].split("\n\n")[0]
    rows = [line.split("|")[1:-1] for line in runs.splitlines() if re.match(r"\| (local|netns|1 proc)", line)]
    assert [(place.strip(), int(p)) for place, p, *_ in rows] == [
        ("1 process", 1), ("local", 2), ("netns 1/host 100mbit", 2)], done.stdout
    # The ring's ideal for d = 4096 on 2 ranks: 2 (P - 1) / P x 8 (d + 1) bytes = 32.8 KB, 3 ms at 100 Mbit/s.
    assert [cell.strip() for cell in rows[2][10:12]] == ["33", "3"], rows[2]
    assert namespaces() <= before, "namespaces left behind"
