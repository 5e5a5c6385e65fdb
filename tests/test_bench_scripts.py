"""scripts/bench_solvers.py's scoring on a small subsample, against cvxpy's optimum."""

import os
import re

import numpy as np
import pytest

from helpers import REPO, load_script, load_svmlight
from helpers import cvxpy_optimum

pytestmark = [pytest.mark.slow, pytest.mark.peers]  # the benchmark scripts, BMRM 2.1 built from source


@pytest.fixture(scope="module")
def bench_solvers():
    return load_script("bench_solvers")


def test_bench_solvers_counts_iterations_to_one_percent_of_a_bracketed_optimum(bench_solvers):
    X, y = load_svmlight("a9a.xz")
    X, y = X[:500], y[:500]
    lam = 1e-2
    outcome = bench_solvers.bench(bench_solvers.oracle(X, y, "hinge"), lam, bench_solvers.runs(),
                                  max_iter=2000, max_seconds=20.0, ref_gap=1e-4)
    optimum, lower = outcome["optimum"], outcome["lower_bound"]
    reference = cvxpy_optimum(X.toarray(), y, "hinge", lam)
    assert lower <= reference * (1 + 1e-7) and reference <= optimum * (1 + 1e-7)
    assert outcome["width"] == pytest.approx((optimum - lower) / optimum) and outcome["width"] <= 1e-4
    runs = outcome["runs"]
    assert [run["label"] for run in runs] == [label for label, _, _ in bench_solvers.runs()]
    assert optimum == min(run["fun"] for run in runs)
    assert lower == max(np.max(run["history"]["lower_bound"]) for run in runs)
    for run in runs:
        best = run["history"]["best_objective"]
        assert run["nit"] == len(best) == len(run["cpu_seconds"])
        t = run["iterations"]
        assert t is not None, run["label"]
        # t is the first iteration within 1%; the run stopped soon after (its bound may trail by a few).
        assert best[t - 1] - optimum <= 0.01 * optimum
        assert t == 1 or best[t - 2] - optimum > 0.01 * optimum
        assert run["seconds"] == run["cpu_seconds"][t - 1] <= run["seconds_total"]
        assert bench_solvers.cell(run) == f"{t:,} ({run['seconds']:.2f} s)"
    outcomes = {("a9a", lam): outcome}
    assert bench_solvers.table(outcomes, ["bmrm"], 1e-4).splitlines()[2].startswith("| a9a | 1e-02 | ")


def test_bench_solvers_reports_runs_cut_by_the_caps(bench_solvers):
    X, y = load_svmlight("a9a.xz")
    plan = [("proximal", "proximal", {}), ("bmrm k=2", "bmrm", {"bundle_size": 2})]
    outcome = bench_solvers.bench(bench_solvers.oracle(X[:500], y[:500], "hinge"), 1e-4, plan, max_iter=30)
    capped = outcome["runs"][1]
    best = capped["history"]["best_objective"]
    assert capped["nit"] == 30 and best[-1] - outcome["optimum"] > 0.01 * outcome["optimum"]
    assert capped["iterations"] is None and capped["seconds"] is None
    assert bench_solvers.cell(capped) == f">30 ({capped['seconds_total']:.2f} s)"


def test_bench_solvers_certified_times_every_solver_and_auto_to_the_gap(bench_solvers):
    X, y = load_svmlight("a9a.xz")
    X, y = X[:500], y[:500]
    lam = 1e-2
    risk = bench_solvers.oracle(X, y, "hinge")
    outcome = bench_solvers.certified(risk, lam, ["dcd", "proximal"], 1e-5, rounds=2)
    reference = cvxpy_optimum(X.toarray(), y, "hinge", lam)
    assert list(outcome) == ["dcd", "proximal", "auto"]
    for run in outcome.values():
        assert run["seconds"] > 0 and run["gap"] <= 1e-5 and "gap <= epsilon" in run["message"]
        assert run["lower_bound"] <= reference + 1e-7 and run["fun"] - reference <= 1e-5 + 1e-7
    assert outcome["auto"]["pick"] == "dcd" and outcome["auto"]["nit"] == outcome["dcd"]["nit"]
    row = bench_solvers.certified_table({("a9a", "hinge", lam): outcome}, ["dcd", "proximal"]).splitlines()[2]
    ratio = outcome["auto"]["seconds"] / min(outcome["dcd"]["seconds"], outcome["proximal"]["seconds"])
    assert row.startswith("| a9a | hinge | 1e-02 | ") and row.endswith(f" (dcd) | {ratio:.2f} |")
    # A run cut by its cap: no time, its last gap in the table.
    capped = bench_solvers.certified(risk, lam, ["bmrm"], 1e-9, max_iter=5)
    assert capped["bmrm"]["seconds"] is None and capped["bmrm"]["nit"] == 5
    row = bench_solvers.certified_table({("a9a", "hinge", lam): capped}, ["bmrm"]).splitlines()[2]
    assert f"| gap {capped['bmrm']['gap']:.1e} (5) |" in row


def test_bench_peers_runs_bmrm21_and_prbmrm_to_the_same_gap(tmp_path, capsys):
    import lzma
    import shutil

    peer_dir = "/work/peers/s/linear-bmrm"
    if not os.path.exists(os.path.join(peer_dir, "linear-bmrm-train")):
        if shutil.which("g++") is None:
            pytest.skip("no g++ to build BMRM 2.1 and no built copy")
        peer_dir = None  # the script builds it
    with lzma.open(os.path.join(REPO, "..", "shared", "data", "a9a.xz"), "rt") as f:
        lines = [next(f) for _ in range(400)]
    with lzma.open(tmp_path / "tiny.xz", "wt") as f:
        f.writelines(lines)
    gap = 1e-4
    argv = ["--sets", "tiny", "--data-dir", str(tmp_path), "--lams", "1e-2", "--ranks", "1",
            "--solvers", "bmrm", "--gap", str(gap)]
    load_script("bench_peers").main(argv + (["--peer-dir", peer_dir] if peer_dir else []))
    lines = capsys.readouterr().out.splitlines()
    header = [cell.strip() for cell in next(line for line in lines if line.startswith("| set")).split("|")[1:-1]]
    first = lines.index("")  # the runs' table ends where the medians' begins
    rows = [dict(zip(header, (cell.strip() for cell in line.split("|")[1:-1])))
            for line in lines[:first] if line.startswith("| tiny")]
    assert [row["run"] for row in rows] == ["BMRM 2.1", "prbmrm bmrm"]
    medians = [line.split("|")[1:-1] for line in lines[first:] if line.startswith("| tiny")]
    assert [cell.strip() for cell in medians[0][3:]] == ["prbmrm bmrm", rows[1]["wall ratio"], rows[1]["wall ratio"]]
    peer, ours = ({name: float(row[name].replace(",", "")) for name in ("iterations", "J")} for row in rows)
    # Both stopped at the absolute gap: their objectives agree to it.
    assert abs(peer["J"] - ours["J"]) <= gap
    assert float(rows[1]["iter ratio"]) == pytest.approx(ours["iterations"] / peer["iterations"], abs=0.01)
    # Each program's own clock around its iterations lies within the wall time of its process.
    for row in rows:
        assert 0.0 <= float(row["solve s"]) <= float(row["wall s"])


def test_bench_highdim_smoke(tmp_path, capsys):
    # Tiny d, 2 iterations, no peer: generation, the worker under a subprocess and the summary.
    load_script("bench_highdim").main(["--nnz", "3000", "--mean-len", "10", "--configs", "12:1",
                                       "--peer-iterations", "0", "--max-iter", "2", "--bundle-memory", "0",
                                       "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    # The solver the command line picks (auto), then its pick and why, and the iterations.
    assert re.search(r"prbmrm d=2\^12 on 1 rank\(s\), auto: [^(]*\((bmrm|proximal): [^)]*\): 2 iterations", out)
    assert "per iteration (CPU, rank 0)" in out and "rank 0: peak RSS" in out and "BMRM 2.1" not in out


def test_bench_imports_measures_every_set_against_the_bare_four(capsys, monkeypatch):
    # One round: a row per import set, each a resident set in MB, the bare four's difference zero.
    monkeypatch.setattr("sys.argv", ["bench_imports.py", "--rounds", "1"])
    load_script("bench_imports").main()
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][2:]
    figures = {name.strip(): (float(rss.split()[0]), float(delta), float(used)) for name, rss, delta, used in rows}
    assert list(figures) == ["prbmrm run", "prbmrm.train", "numpy scipy h5py mpi4py",
                             "numpy scipy.constants h5py mpi4py", "numpy scipy.sparse h5py mpi4py",
                             "numpy scipy.sparse scipy.linalg h5py mpi4py"]
    assert figures["numpy scipy h5py mpi4py"][1] == 0.0 and figures["numpy scipy.constants h5py mpi4py"][2] == 0.0
    assert all(rss > 10.0 for rss, _, _ in figures.values())  # a Python process with numpy takes more than 10 MB


def test_bench_wait_pattern_times_both_waits_at_each_rank_count(capsys, monkeypatch):
    # One round on 2 and 3 ranks, a few iterations: a row per (P, wait), then the medians against the smallest P.
    monkeypatch.setattr("sys.argv", ["bench_wait.py", "--pattern", "--ranks", "2", "3", "--repeats", "1",
                                     "--iterations", "5", "--work-ms", "1"])
    load_script("bench_wait").main()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    runs = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines if line.startswith("| 1 |")]
    cores = len(os.sched_getaffinity(0))
    # The node relay where the ranks outnumber the cores (3 ranks on 2 cores: at P = 3 alone).
    relayed = [ranks for ranks in ("2", "3") if int(ranks) > cores]
    assert [(run[1], run[2]) for run in runs] == [
        (ranks, wait) for ranks in ("2", "3")
        for wait in ("polled (Watch.wait)", "MPI_Wait") + (("node relay",) if ranks in relayed else ())]
    for run in runs:
        comm, wall, cpu = map(float, run[3:])
        assert 0.0 <= comm <= wall and cpu > 0.0  # rank 0's waits lie within its iterations
    medians = [line for line in lines if line.startswith(("| polled", "| MPI_Wait"))]
    assert len(medians) == 4 and all("1.00x" in line for line in medians[::2])
    relay = [line for line in lines if line.startswith("| node relay")]
    assert len(relay) == len(relayed) and all("1.00x" in line for line in relay[:1])
