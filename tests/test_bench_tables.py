"""scripts/bench_scale.py's medians over rounds and scripts/bench_startup.py's steps, against sums and medians
computed here; bench_startup end to end on 1 rank (pytest -m peers)."""

import os
import statistics
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO, data_path, load_script


def test_bench_scale_medians_take_each_phase_over_the_rounds_and_compare_with_the_smallest_p():
    bench_scale = load_script("bench_scale")
    rng = np.random.default_rng(3)
    rows = []
    for ranks in (64, 8):  # the larger P first: the ratio must still be to the smallest
        for _ in range(3):
            ms = {phase: float(rng.uniform(1, 50)) for phase in ("iteration", "risk", "subproblem", "comm")}
            rows.append(("local", dict(ranks=ranks, ms=ms, wall=float(rng.uniform(5, 30)),
                                       startup=float(rng.uniform(1, 20)), load=float(rng.uniform(0, 40)))))
    lines = bench_scale.medians(rows).splitlines()
    assert len(lines) == 4
    cells = {int(line.split("|")[2]): [cell.strip() for cell in line.split("|")[1:-1]] for line in lines[2:]}
    comm = {}
    for ranks in (8, 64):
        runs = [r for _, r in rows if r["ranks"] == ranks]
        comm[ranks] = statistics.median(r["ms"]["comm"] for r in runs)
        expected = [f"{statistics.median(r['ms'][phase] for r in runs):.1f}"
                    for phase in ("iteration", "risk", "subproblem", "comm")]
        assert cells[ranks][2] == "3"
        assert cells[ranks][3:7] == expected
        assert cells[ranks][8] == f"{statistics.median(r['wall'] for r in runs):.1f}"
        assert cells[ranks][10] == ", ".join(f"{r['load']:.1f}" for r in runs)
    assert cells[8][7] == "1.00x"
    assert cells[64][7] == f"{comm[64] / comm[8]:.2f}x"


def test_bench_startup_steps_are_the_differences_of_the_marks():
    bench_startup = load_script("bench_startup")
    marks = [["interpreter", 0.031], ["imports", 0.25], ["read", 0.3125]]
    steps = bench_startup.steps(marks)
    assert [label for label, _ in steps] == ["interpreter", "imports", "read", "total"]
    assert [seconds for _, seconds in steps][:3] == [0.031, 0.25 - 0.031, 0.3125 - 0.25]
    assert steps[-1] == ("total", 0.3125)
    # The start-up: the 1-iteration run less a tenth of what 10 more iterations took.
    row = bench_startup.startup_row(2, 0.25, 0.28, 0.32, 0.52)
    assert row.split("|")[4].strip().startswith(f"{0.32 - 0.02:.3f} (+{0.30 - 0.25:.3f} s over bare")


@pytest.mark.peers  # runs a benchmark script
def test_bench_startup_reports_every_step_on_one_rank(tmp_path):
    done = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_startup.py"), "--ranks", "1",
                           "--repeats", "1", "--data", data_path("a9a.xz"), "--parts", "2"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| 1 |")]
    labels = [(job.strip(), step.strip()) for _, job, step, _ in rows]
    assert labels[:3] == [("bare", "interpreter"), ("bare", "imports"), ("bare", "total")]
    assert [step for job, step in labels if job == "steps"] == [
        "interpreter", "numpy, scipy.sparse, h5py", "mpi4py (MPI_Init)", "prbmrm's modules", "communicator",
        "read the shard", "total"]
    assert ("train 1", "total") in labels and ("train 11", "total") in labels
    assert labels[-1][0].startswith("train 1 less one iteration")
    assert "| numpy |" in done.stdout
