"""Scaling over ranks, T(p), on this machine and on network-namespace hosts (cluster/netns_cluster.sh).

The users' command, ``mpiexec ... -n P python -m prbmrm.train`` (hinge, BMRM,
a fixed number of iterations: no stopping test), for p = 1, 2, 4, ... on

- ``local``: one machine, ``mpiexec -n P`` as a user runs it;
- ``netns``: P namespace hosts of ``--ppn`` ranks each, every host's link
  limited to ``--rate`` by a token-bucket filter (cluster/netns_cluster.sh:
  hydra launches a proxy "on" each host, the ranks talk TCP over the hosts'
  eth0 and nothing else).

Per run, from the model's ``/history`` (rank 0's seconds of each phase per
iteration, medians over the iterations after the first): risk, subproblem
and communication ms per iteration (communication is rank 0's time in the
reduction and broadcast, waiting for the slowest rank included); start-up
(mpiexec's wall time less the training's, so launch, imports, reading the
shards, writing the model); the summed peak RSS of the ranks (VmHWM of every
rank's process, polled from /proc); on the namespace hosts the bytes the
busiest host's eth0 sent and received per iteration, against a float64 ring
Allreduce's 2 (P - 1) / P x 8 (d + 1) bytes per link, and that ideal's time
at ``--rate``. Then the least-squares fit T(p) = s + t / p + c log p of the
ms per iteration of each place, and a projection to 64 dedicated cores on 4
and 8 nodes: s and t from this machine's runs on at most as many ranks as it
has cores (dedicated), c from the namespace hosts' runs (the cost of a
doubling of the ranks over the network). Printed as markdown with the
command, the commit and the machine.

MPICH's netmod follows MPIR_CVAR_CH4_NETMOD (the wheel's default, UCX, or
``ofi`` with FI_PROVIDER=tcp): on 32 namespace hosts of this loaded 2-core
machine UCX's wire-up in MPI_Init failed now and then ("No route to host"),
libfabric's did not.

The data: hashed-text-like sparse rows (``--rows`` x 2^``--log-dim``, about
``--words`` nonzeros a row, Zipf-distributed words hashed into the columns,
log(1 + count) values, unit rows) in ``--shards`` shard files, or ``--data
DIR`` (a shard directory). The ranks run the prbmrm that ``import prbmrm``
finds here: the installed package, or a checkout on PYTHONPATH (mpiexec
passes the environment on to every host).

    python scripts/bench_scale.py                                  # modest: p = 1, 2, 4 local and netns
    python scripts/bench_scale.py --ranks 1 2 4 8 16 32 64 --iterations 30 --repeats 2   # the full run
    python scripts/bench_scale.py --acceptance                     # 16 hosts x 1 rank, 100 Mbit/s, d = 2^17

``--acceptance`` is issue 26's multi-node point: 16,000 rows in 16 shards,
d = 2^17, 16 namespace hosts of 1 rank, every link at 100 Mbit/s. The
namespace runs need root, iproute2 and util-linux; without them only the
local runs are made (the reason is printed).
"""

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NETNS = os.path.join(REPO, "cluster", "netns_cluster.sh")
sys.path.insert(0, HERE)
from bench_ranks import fit_scaling  # noqa: E402  (one fit for the two benchmarks)

DEADLINE = 1800  # seconds for one run: a hung run stops the benchmark, not the machine


class RunFailed(RuntimeError):
    """A training run that ended with an error: reported, and the benchmark goes on."""


def hashed_text(rows, log_dim, words, seed=0):
    """Sparse rows like hashed bag-of-words text, and +-1 labels from a sparse true model with 5% noise."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    d = 1 << log_dim
    lengths = rng.poisson(words, rows) + 1
    vocabulary = 50 * d  # more words than buckets: collisions, as hashing has
    tokens = np.minimum(rng.zipf(1.3, lengths.sum()), vocabulary) - 1
    columns = (tokens * 2654435761) % d  # Knuth's multiplicative hash
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    X = sp.csr_matrix((np.ones(len(columns)), columns, indptr), shape=(rows, d))
    X.sum_duplicates()
    X.data = np.log1p(X.data)
    X = sp.diags(1.0 / np.sqrt(X.multiply(X).sum(axis=1)).A1) @ X
    truth = rng.standard_normal(d) * (rng.random(d) < 0.05)
    y = np.sign(X @ truth + 0.05 * rng.standard_normal(rows))
    y[y == 0] = 1.0
    flip = rng.random(rows) < 0.05
    y[flip] = -y[flip]
    return X.tocsr(), y


def make_shards(args, directory):
    from prbmrm.io import write_shards

    X, y = hashed_text(args.rows, args.log_dim, args.words)
    write_shards(X, y, directory, args.shards)
    return X.shape[1], X.nnz


class PeakRSS(threading.Thread):
    """Polls /proc for the ranks whose environment holds TAG; the sum of their VmHWM (peak RSS), the last seen."""

    def __init__(self, tag):
        super().__init__(daemon=True)
        self.marker = f"PRBMRM_BENCH_TAG={tag}".encode()
        self.peaks = {}
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.1):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read().split(b"\0")
                    # The ranks, not mpiexec (whose command line names prbmrm.train too).
                    if not os.path.basename(argv[0]).startswith(b"python") or b"prbmrm.train" not in argv:
                        continue
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        if self.marker not in f.read().split(b"\0"):
                            continue
                    with open(f"/proc/{pid}/status") as f:
                        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
                except (OSError, StopIteration, ValueError):
                    continue
                self.peaks[pid] = max(self.peaks.get(pid, 0), hwm * 1024)

    def stop(self):
        self.done.set()
        self.join()
        return sum(self.peaks.values()), len(self.peaks)


class Cluster:
    """A namespace cluster of `hosts` hosts (cluster/netns_cluster.sh), removed by close()."""

    def __init__(self, hosts, rate):
        self.directory = tempfile.mkdtemp(prefix="bench-scale-netns-")
        self.hosts = hosts
        done = subprocess.run(["bash", NETNS, "up", self.directory, str(hosts)] + ([rate] if rate else []),
                              capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            self.close()
            raise RuntimeError(done.stderr.strip())

    def launcher(self, ranks, ppn):
        hosts = ",".join(f"h{i + 1}:{ppn}" for i in range(math.ceil(ranks / ppn)))
        return ["bash", NETNS, "mpiexec", self.directory, "-hosts", hosts, "-n", str(ranks)]

    def link_bytes(self):
        done = subprocess.run(["bash", NETNS, "bytes", self.directory], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, check=True)
        lines = (line.split() for line in done.stdout.splitlines())
        return {host: np.array([int(rx), int(tx)]) for host, rx, tx in lines}

    def close(self):
        subprocess.run(["bash", NETNS, "down", self.directory], timeout=300, stdin=subprocess.DEVNULL)
        shutil.rmtree(self.directory, ignore_errors=True)


def local_launcher(ranks, ppn):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return [mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", str(ranks)]


def serial_launcher(ranks, ppn):
    """One process, no MPI launcher: the reference every model is compared with, bit for bit."""
    return []


def run(args, shards, ranks, launcher, cluster=None):
    """One training on `ranks` ranks; its phases per iteration, start-up, peak RSS and link bytes."""
    workdir = tempfile.mkdtemp(prefix="bench-scale-")
    out = os.path.join(workdir, "model.h5")
    tag = uuid.uuid4().hex
    environ = dict(os.environ, PRBMRM_BENCH_TAG=tag, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   MKL_NUM_THREADS="1")
    command = launcher + [sys.executable, "-m", "prbmrm.train", "--data", shards,
                          "--out", out, "--solver", args.solver, "--lam", str(args.lam), "--epsilon", "0",
                          "--rel-epsilon", "0", "--max-iter", str(args.iterations), "--quiet"]
    before = cluster.link_bytes() if cluster else {}
    monitor = PeakRSS(tag)
    monitor.start()
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=environ, cwd=workdir,
                              timeout=DEADLINE, stdin=subprocess.DEVNULL)
    finally:
        wall = time.perf_counter() - started
        rss, _ = monitor.stop()
    after = cluster.link_bytes() if cluster else {}
    try:
        if done.returncode != 0:
            raise RunFailed(f"bench_scale: the run on {ranks} rank(s) failed ({done.returncode}):\n"
                            f"{' '.join(command)}\n{done.stderr[-3000:]}")
        from prbmrm.model import load_model

        model = load_model(out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    history = model.history
    steps = slice(1, None) if len(history["seconds_risk"]) > 1 else slice(None)  # the first warms caches
    ms = {phase: 1e3 * float(np.median(history[f"seconds_{phase}"][steps]))
          for phase in ("risk", "subproblem", "comm")}
    ms["iteration"] = 1e3 * float(np.median((history["seconds_risk"] + history["seconds_subproblem"]
                                             + history["seconds_comm"])[steps]))
    iterations = int(model.attrs["iterations"])
    # The busiest direction of the busiest link: what the ring's ideal counts.
    moved = max((int(np.max(after[h] - before[h])) for h in before), default=0)
    return dict(ranks=ranks, ms=ms, iterations=iterations, startup=wall - float(history["seconds_total"][-1]),
                wall=wall, load=os.getloadavg()[0], rss=rss, link_bytes=moved / iterations if cluster else None,
                d=int(model.attrs["n_features"]), w=model.w)


def ideal_bytes(ranks, d):
    """A float64 ring Allreduce's bytes over one link (sent by one rank) for d + 1 values."""
    return 2 * (ranks - 1) / ranks * 8 * (d + 1)


def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.node()}: {os.cpu_count()} cores ({model}), Linux {platform.release()}"


def commit():
    def git(*args):
        return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + (" (uncommitted changes)" if git("status", "--porcelain") else "")


def table(rows, d, rate_bits):
    lines = ["| place | P | iterations | ms/iteration | risk | subproblem | comm | start-up s | peak RSS MB (sum) |"
             " busiest link KB/iteration | ring ideal KB | ideal ms at rate | comm / ideal | comm in messages |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for place, r in rows:
        ms = r["ms"]
        link = ideal = ideal_ms = ratio = messages = ""
        if r["link_bytes"] is not None:
            # A link moves the ring's bytes in both directions: the sent and the received halves.
            link = f"{r['link_bytes'] / 1e3:.0f}"
            ideal = f"{ideal_bytes(r['ranks'], d) / 1e3:.0f}"
            if rate_bits and r["ranks"] > 1:
                seconds = 8 * ideal_bytes(r["ranks"], d) / rate_bits
                ideal_ms, ratio = f"{1e3 * seconds:.0f}", f"{ms['comm'] / (1e3 * seconds):.1f}x"
                # Without added latency a link's time is its bytes: the communication in units of one
                # message of d + 1 doubles is the length of the critical path in messages (a ring
                # Allreduce: 2 (P - 1) / P; reduce and broadcast down a binomial tree: 2 log2 P).
                messages = f"{ms['comm'] / (1e3 * 8 * 8 * (d + 1) / rate_bits):.1f}"
        lines.append(f"| {place} | {r['ranks']} | {r['iterations']} | {ms['iteration']:.1f} | {ms['risk']:.1f} | "
                     f"{ms['subproblem']:.1f} | {ms['comm']:.1f} | {r['startup']:.2f} | {r['rss'] / 2**20:.0f} | "
                     f"{link} | {ideal} | {ideal_ms} | {ratio} | {messages} |")
    return "\n".join(lines)


def medians(rows):
    """Per place and P, the medians over the interleaved rounds, and communication against the smallest P's."""
    lines = ["| place | P | rounds | ms/iteration | risk | subproblem | comm | comm / smallest P's | wall s |"
             " start-up s | load (1 min) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups = {}
    for place, r in rows:
        groups.setdefault((place, r["ranks"]), []).append(r)
    smallest = {}
    for (place, ranks), runs in sorted(groups.items(), key=lambda item: item[0][1]):
        median = {phase: float(np.median([r["ms"][phase] for r in runs]))
                  for phase in ("iteration", "risk", "subproblem", "comm")}
        smallest.setdefault(place, median["comm"])
        loads = ", ".join(f"{r['load']:.1f}" for r in runs)
        lines.append(f"| {place} | {ranks} | {len(runs)} | {median['iteration']:.1f} | {median['risk']:.1f} | "
                     f"{median['subproblem']:.1f} | {median['comm']:.1f} | {median['comm'] / smallest[place]:.2f}x | "
                     f"{np.median([r['wall'] for r in runs]):.1f} | {np.median([r['startup'] for r in runs]):.2f} | "
                     f"{loads} |")
    return "\n".join(lines)


def rate_in_bits(rate):
    """tc's rate ('100mbit', '1gbit', '500kbit') in bits per second."""
    if not rate:
        return None
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, factor in units.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * factor
    raise SystemExit(f"bench_scale: --rate {rate}: use kbit, mbit or gbit (tc's units)")


def fits(rows, cores):
    """Per place, the fit of ms per iteration, and the projection to 64 dedicated cores on 4 and 8 nodes."""
    out = []
    fitted = {}
    # The 1-process run is this machine's P = 1.
    rows = [("local" if place == "1 process" else place, r) for place, r in rows]
    for place in dict.fromkeys(place for place, _ in rows):
        runs = [r for p, r in rows if p == place]
        if len({r["ranks"] for r in runs}) < 3:
            continue
        (s, t, c), _ = fit_scaling([r["ranks"] for r in runs], [r["ms"]["iteration"] for r in runs])
        fitted[place] = (s, t, c)
        out.append(f"| {place} | {s:.2f} | {t:.2f} | {c:.2f} | {s + t / 64 + c * math.log(64):.1f} |")
    lines = ["| fit of ms per iteration, T(p) = s + t/p + c log p | s | t | c | T(64) |",
             "| --- | --- | --- | --- | --- |", *out]
    dedicated = [r for p, r in rows if p == "local" and r["ranks"] <= cores]
    network = [k for k in fitted if k.startswith("netns")]
    if len({r["ranks"] for r in dedicated}) >= 2 and network:
        # Two points fit s and t (the ranks had a core each); the network's c comes from the hosts.
        p = np.array([r["ranks"] for r in dedicated], dtype=float)
        design = np.column_stack([np.ones_like(p), 1.0 / p])
        s, t = np.linalg.lstsq(design, [r["ms"]["iteration"] for r in dedicated], rcond=None)[0]
        c_net = fitted[network[0]][2]
        c_node = fitted["local"][2] if "local" in fitted else c_net
        for nodes in (4, 8):
            # The ranks of a node reduce among themselves (local c, log of the ranks per node), the
            # nodes over the network (the hosts' c, log of the nodes).
            projected = s + t / 64 + c_node * math.log(64 / nodes) + c_net * math.log(nodes)
            lines.append(f"| projection: 64 dedicated cores on {nodes} nodes (s, t: local P <= {cores}; "
                         f"c: local within a node, {network[0]} across) | {s:.2f} | {t:.2f} | "
                         f"{c_node:.2f} / {c_net:.2f} | {projected:.1f} |")
    return "\n".join(lines)


def compare(path, rows):
    """Communication ms and busiest-link bytes per iteration of an earlier run's --json against this one."""
    with open(path) as f:
        earlier = json.load(f)
    then = {(r["place"], r["ranks"]): r for r in earlier["runs"]}
    lines = [f"| place | P | comm ms then ({earlier['commit']}) | now | then / now | link KB then | now |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for place, r in rows:
        old = then.get((place, r["ranks"]))
        if old is None or place == "1 process":
            continue
        link = (f"{old['link_bytes'] / 1e3:.0f} | {r['link_bytes'] / 1e3:.0f}" if r["link_bytes"] is not None
                and old.get("link_bytes") is not None else " | ")
        lines.append(f"| {place} | {r['ranks']} | {old['ms']['comm']:.1f} | {r['ms']['comm']:.1f} | "
                     f"{old['ms']['comm'] / r['ms']['comm']:.1f}x | {link} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--where", nargs="+", choices=("local", "netns"), default=["local", "netns"])
    parser.add_argument("--ppn", type=int, default=1, help="ranks per namespace host (default 1)")
    parser.add_argument("--rate", default="1gbit", help="each namespace host's link, tc units (default 1gbit; "
                        "'' for none)")
    parser.add_argument("--data", help="a shard directory (default: hashed text made here)")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--log-dim", type=int, default=17, help="d = 2^LOG_DIM columns (default 17)")
    parser.add_argument("--words", type=int, default=60, help="mean nonzeros a row (default 60)")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--solver", default="bmrm")
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds over every (place, P)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--baseline", help="a --json file of an earlier run (another commit): a table of "
                        "communication per iteration then and now, per place and P")
    parser.add_argument("--acceptance", action="store_true",
                        help="issue 26's point: 16 netns hosts x 1 rank at 100mbit, 16,000 x 2^17 in 16 shards")
    args = parser.parse_args()
    if args.acceptance:
        args.ranks, args.where, args.ppn, args.rate = [16], ["netns"], 1, "100mbit"
        args.rows, args.log_dim, args.shards = 16000, 17, 16
    rate_bits = rate_in_bits(args.rate)
    places = list(args.where)
    if "netns" in places and os.geteuid() != 0:
        print("bench_scale: no namespace hosts: they need root (ip netns add)")
        places.remove("netns")
    if "netns" in places and not all(shutil.which(tool) for tool in ("ip", "tc", "unshare")):
        print("bench_scale: no namespace hosts: ip, tc or unshare missing (apt-get install iproute2 util-linux)")
        places.remove("netns")
    if not places:
        sys.exit("bench_scale: nothing to run")

    import prbmrm

    scratch = tempfile.mkdtemp(prefix="bench-scale-data-")
    cluster = None
    try:
        if args.data:
            shards, nnz = os.path.abspath(args.data), None  # the runs start in a scratch directory
        else:
            shards = os.path.join(scratch, "shards")
            nnz = make_shards(args, shards)[1]
        netns_name = f"netns {args.ppn}/host" + (f" {args.rate}" if args.rate else "")
        if "netns" in places:
            cluster = Cluster(math.ceil(max(args.ranks) / args.ppn), args.rate)
        first = dict(run(args, shards, 1, serial_launcher(1, 1)), bitwise=True)
        reference = first.pop("w")
        rows, failed = [("1 process", first)], []
        for _ in range(args.repeats):
            for ranks in args.ranks:
                for place in places:
                    launcher = cluster.launcher(ranks, args.ppn) if place == "netns" else local_launcher(ranks, 1)
                    try:
                        result = run(args, shards, ranks, launcher, cluster if place == "netns" else None)
                    except RunFailed as failure:  # the other runs' figures still count
                        print(failure, file=sys.stderr, flush=True)
                        failed.append(f"{place} P={ranks}")
                        continue
                    result["bitwise"] = bool(np.array_equal(result.pop("w"), reference))
                    rows.append((netns_name if place == "netns" else "local", result))
                    print(f"  {rows[-1][0]} P={ranks}: {result['ms']['iteration']:.1f} ms/iteration "
                          f"(comm {result['ms']['comm']:.1f}), wall {result['wall']:.1f} s, load "
                          f"{result['load']:.1f}, same w as 1 process: {result['bitwise']}",
                          file=sys.stderr, flush=True)
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(scratch, ignore_errors=True)

    d, load = rows[0][1]["d"], os.getloadavg()[0]
    data = args.data or f"hashed text {args.rows} x 2^{args.log_dim} ({nnz} nonzeros) in {args.shards} shards"
    print(f"## bench_scale: T(p) on {data}, d = {d}\n")
    print(f"- command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`")
    print(f"- commit: {commit()}; prbmrm {prbmrm.__version__} from {os.path.dirname(prbmrm.__file__)}")
    print(f"- machine: {machine()}; load average (1 min) at the end: {load:.1f}")
    print(f"- runs: `mpiexec [-hosts h1:PPN,...] -n P python -m prbmrm.train --solver {args.solver} "
          f"--lam {args.lam:g} --epsilon 0 --rel-epsilon 0 --max-iter {args.iterations}`; ms are medians over "
          f"iterations 2.. of rank 0's phases; MPICH netmod: {os.environ.get('MPIR_CVAR_CH4_NETMOD', 'default')}; "
          "every model bitwise equal to the 1-process one: "
          f"{all(r['bitwise'] for _, r in rows)}\n")
    if failed:
        print(f"- failed (their errors above, on stderr): {', '.join(failed)}\n")
    print(table(rows, d, rate_bits))
    print()
    print(medians(rows))
    print()
    print(fits(rows, os.cpu_count() or 1))
    if args.baseline:
        print()
        print(compare(args.baseline, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "commit": commit(), "machine": machine(), "d": d, "load": load,
                       "runs": [dict(place=p, **r) for p, r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
