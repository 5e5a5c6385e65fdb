"""``prbmrm train`` as a newcomer meets it: labels as they come, a run that says what it does, resume that
guides, every option in --print-config, "did you mean" for every unknown name."""

import json
import os
import shlex
import signal
import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import dump_svmlight_file

from helpers import HANG_SECONDS, REPO, data_path, run_ranks
from prbmrm import training
from prbmrm.cli.train import main as train_main
from prbmrm.distributed.comm import SerialComm


@pytest.fixture(scope="module")
def zero_one(tmp_path_factory):
    """The demo data with 0/1 labels: a training and a held-out SVMlight file, and the held-out labels."""
    root = tmp_path_factory.mktemp("zero_one")
    X, y = training.load_demo()
    labels = (y > 0).astype(int)
    rows = np.random.default_rng(0).permutation(len(y))
    train, test = rows[:400], rows[400:]
    dump_svmlight_file(X[train], labels[train], str(root / "train.svm"), zero_based=False)
    dump_svmlight_file(X[test], labels[test], str(root / "test.svm"), zero_based=False)
    return root, labels[test]


@pytest.mark.parametrize("ranks", [1, 2])
def test_zero_one_labels_train_without_positive_and_predict_in_their_own_values(zero_one, tmp_path, ranks):
    root, truth = zero_one
    model = tmp_path / "m.h5"
    done, _ = run_ranks(ranks, ["-m", "prbmrm.cli.train", "--data", str(root / "train.svm"), "--loss", "hinge",
                                "--lam", "1e-3", "--out", str(model)])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # The mapping printed once, then the line naming the solver, before the first iteration.
    assert lines[0] == "labels: 0 -> -1, 1 -> +1 (two classes; --positive LABEL chooses the +1 class)"
    assert lines[1].startswith(f"training on 400 examples x 30 features, {ranks} rank(s): loss hinge, l2 lam 0.001")
    assert "; solver auto (the default for a quadratic regularizer, one lam and 30 weights" in lines[1]
    assert "): proximal first, as " in lines[1]  # auto's pick on this data, named before the first iteration
    assert lines[2].split()[0] == "iter" and sum(line.startswith("labels:") for line in lines) == 1
    labels = tmp_path / "labels.txt"
    done, _ = run_ranks(ranks, ["-m", "prbmrm.cli.predict", "--model", str(model), "--data", str(root / "test.svm"),
                                "--labels", str(labels)])
    assert done.returncode == 0, done.stderr
    predicted = np.loadtxt(labels)
    assert set(np.unique(predicted)) <= {0.0, 1.0}
    accuracy = float(done.stdout.split("accuracy ")[1].split(",")[0])
    assert accuracy == pytest.approx(np.mean(predicted == truth), abs=5e-7)  # the true one, as printed (6 digits)


def test_the_interrupt_prints_the_command_that_resumes_and_the_log_holds_every_iteration_once(tmp_path):
    a9a = tmp_path / "a9a.svm"
    subprocess.run(["xz", "-dkc", data_path("a9a.xz")], stdout=open(a9a, "wb"), check=True, stdin=subprocess.DEVNULL)
    log, checkpoint = tmp_path / "log.jsonl", tmp_path / "ck.h5"
    argv = ["--data", str(a9a), "--lam", "1e-6", "--solver", "bmrm", "--epsilon", "1e-4", "--max-iter", "3000",
            "--checkpoint", str(checkpoint), "--checkpoint-every", "7", "--log-json", str(log),
            "--out", str(tmp_path / "m.h5"), "--print-every", "1"]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-m", "prbmrm.cli.train", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    for line in child.stdout:
        if line.split()[:1] == ["30"]:
            child.send_signal(signal.SIGINT)
            break
    out, err = child.communicate(timeout=HANG_SECONDS)
    assert child.returncode == 130, err
    command = err.split("to continue: ")[1].strip()
    words = shlex.split(command)
    assert words[:3] == [os.path.basename(sys.executable), "-m", "prbmrm.cli.train"]
    assert words[3:] == argv + ["--resume", str(checkpoint)]
    stopped = json.loads(log.read_text().splitlines()[-1])["iteration"]
    resumed = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, cwd=tmp_path, env=env,
                             stdin=subprocess.DEVNULL, timeout=HANG_SECONDS)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed at iteration {stopped} from {checkpoint}" in resumed.stdout.splitlines()[1]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [row["iteration"] for row in rows] == list(range(1, len(rows) + 1))
    model = training.fit(str(a9a), lam=1e-6, solver="bmrm", epsilon=1e-4, max_iter=3000)
    assert len(rows) == model.attrs["iterations"]  # the same run as one without the interruption


def test_a_resumed_log_drops_the_iterations_after_its_checkpoint(tmp_path):
    log = tmp_path / "log.jsonl"
    argv = ["--lam", "1e-4", "--solver", "bmrm", "--max-iter", "12", "--checkpoint", str(tmp_path / "ck.h5"),
            "--log-json", str(log), "--out", str(tmp_path / "m.h5"), "--quiet"]
    assert train_main(argv, SerialComm()) == 0
    # As if killed at iteration 15 after the checkpoint of iteration 12 (the lines of 13-15 and a torn line).
    extra = [json.dumps(dict(json.loads(log.read_text().splitlines()[-1]), iteration=i)) for i in (13, 14, 15)]
    log.write_text(log.read_text() + "\n".join(extra) + "\n{\"iter")
    assert train_main([*argv[:5], "20", *argv[6:], "--resume-if-exists"], SerialComm()) == 0
    assert [json.loads(line)["iteration"] for line in log.read_text().splitlines()] == list(range(1, 21))


def test_print_config_writes_every_option(capsys):
    assert train_main(["--print-config"], SerialComm()) == 0
    text = capsys.readouterr().out
    for unset in ("data", "solver", "epsilon", "rel_epsilon", "checkpoint", "resume", "positive", "log_json",
                  "dp_epsilon", "roster"):
        assert f"\n# {unset} = ...  (not set: " in text
    assert '\nloss = "hinge"\n' in text and "\n[privacy]\n# data = ...  (not set: the files of one party" in text


@pytest.mark.parametrize("argv, hint", [(["--lamda", "1"], "unrecognized arguments: --lamda 1; did you mean --lam?"),
                                        (["--loss", "hingee"], "unknown loss 'hingee'; did you mean 'hinge'?"),
                                        (["--solver", "bmrn"], "unknown solver 'bmrn'; did you mean 'bmrm'?"),
                                        (["--reg", "l22"], "unknown regularizer 'l22'; did you mean 'l2'?")])
def test_did_you_mean_for_every_unknown_name(argv, hint):
    done, _ = run_ranks(1, ["-m", "prbmrm.cli.train", *argv, "--quiet"])
    assert done.returncode == 2 and hint in done.stderr and "Traceback" not in done.stderr


def test_a_run_stopped_at_max_iter_says_so_in_its_last_line(tmp_path):
    done, _ = run_ranks(1, ["-m", "prbmrm.train", "--lam", "1e-6", "--max-iter", "5", "--out", str(tmp_path / "m.h5")])
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("not converged: stopped at --max-iter 5 with gap ") and "warning" not in done.stderr
