"""--resume-if-exists: one command starts or continues a run (a requeued batch job), and the summary
of a resumed run counts that run only."""

import re

from helpers import run_ranks

RUN = ["-m", "prbmrm.cli.train", "--lam", "1e-3", "--rel-epsilon", "0", "--print-every", "1"]
SUMMARY = re.compile(r"seconds: risk ([\d.]+), subproblem ([\d.]+), comm ([\d.]+), total ([\d.]+)")
ROW = re.compile(r"^\s*(\d+)\s+-?\d\.\d+e[+-]\d+ ", re.MULTILINE)


def test_resume_if_exists_starts_then_continues(tmp_path):
    options = [*RUN, "--checkpoint", str(tmp_path / "c.h5"), "--resume-if-exists", "--out", str(tmp_path / "m.h5")]
    runs = []
    for max_iter in (5, 12):
        completed, _ = run_ranks(1, [*options, "--max-iter", str(max_iter)], timeout=120)
        assert completed.returncode == 0, completed.stderr
        runs.append(completed.stdout)
    first, second = ([int(n) for n in ROW.findall(out)] for out in runs)
    assert first == list(range(1, 6)) and second == list(range(6, 13))  # the second run continued
    for out in runs:
        risk, subproblem, comm, total = map(float, SUMMARY.search(out).groups())
        assert risk + subproblem + comm <= total  # this run's phases within this run's total


def test_resume_if_exists_needs_a_checkpoint(tmp_path):
    completed, _ = run_ranks(1, [*RUN, "--resume-if-exists", "--out", str(tmp_path / "m.h5")], timeout=120)
    assert completed.returncode == 2
    assert "--resume-if-exists needs --checkpoint PATH" in completed.stderr
