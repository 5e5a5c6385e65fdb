"""Output files under failure: a full disk, a file-size limit, two jobs writing the same names.

The disk-full runs use a 1 MiB tmpfs (mounting needs root: skipped with the
reason otherwise) filled to 40 KiB with a filler file; the file-size runs
set RLIMIT_FSIZE in the child (Python ignores SIGXFSZ, so a write past the
limit fails with EFBIG instead of killing the process).
"""

import glob
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import scipy.sparse as sp
import pytest

from helpers import REPO, run_ranks
from prbmrm.checkpoint import load_checkpoint, save_checkpoint
from prbmrm.errors import CollectiveError, InputError, UsageError
from prbmrm.io.files import OutputClaim, lock_name
from prbmrm.model import load_model, save_model
from prbmrm.training import run

TRAIN = ["-m", "prbmrm.cli.train", "--quiet"]
LONG = ["--lam", "1e-7", "--rel-epsilon", "0", "--max-iter", "400"]  # the demo never converges in 400


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs with 40 KiB left free (a first checkpoint fits, a 400-iteration model does not)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        with open(mount / "filler", "wb") as f:
            f.write(b"\0" * (1024 - 40) * 1024)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True, stdin=subprocess.DEVNULL)


def one_error(completed, *words):
    """The job failed with exit 2 and a single-line message on stderr containing `words`."""
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prbmrm.cli.train: error: "), completed.stderr
    for word in words:
        assert word in lines[0], lines[0]


def leftovers(directory):
    return glob.glob(os.path.join(directory, ".*.tmp-*")) + glob.glob(os.path.join(directory, ".*.lock"))


@pytest.mark.parametrize("ranks", [1, 2])
def test_checkpoint_on_a_full_disk_is_one_error(small_disk, tmp_path, ranks):
    """Rank 0 segfaulted in HDF5's close after the failed flush, leaving .ck.h5.tmp-PID."""
    checkpoint = small_disk / "ck.h5"
    completed, _ = run_ranks(ranks, [*TRAIN, *LONG, "--checkpoint", str(checkpoint), "--checkpoint-every", "1",
                                     "--out", str(tmp_path / "model.h5")], timeout=120)
    one_error(completed, str(checkpoint), "cannot write the checkpoint", "No space left on device")
    assert leftovers(small_disk) == []
    state, meta = load_checkpoint(str(checkpoint))  # the last one that fitted, intact
    assert 1 <= meta["iteration"] == state["iteration"] < 400
    assert not os.path.exists(tmp_path / "model.h5")


def test_model_on_a_full_disk_is_one_error(small_disk):
    out = small_disk / "model.h5"
    completed, _ = run_ranks(1, [*TRAIN, *LONG, "--out", str(out)], timeout=120)
    one_error(completed, str(out), "cannot write the model file", "No space left on device")
    assert sorted(os.listdir(small_disk)) == ["filler"]


def test_json_log_on_a_full_disk_keeps_whole_lines(small_disk, tmp_path):
    log = small_disk / "log.jsonl"
    completed, _ = run_ranks(1, [*TRAIN, *LONG, "--log-json", str(log), "--out", str(tmp_path / "m.h5")],
                             timeout=120)
    one_error(completed, str(log), "cannot write the --log-json file", "No space left on device")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [row["iteration"] for row in rows] == list(range(1, len(rows) + 1)) and len(rows) > 10
    assert leftovers(small_disk) == []


# MPI starts before the limit is set: its shared-memory transport makes files of several MiB.
LIMITED = """import resource, runpy, sys
from mpi4py import MPI
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.argv[0] = "prbmrm.cli.train"
runpy.run_module("prbmrm.cli.train", run_name="__main__")
"""


@pytest.mark.parametrize("what, options", [
    ("model file", []),
    ("checkpoint", ["--checkpoint", "{dir}/ck.h5", "--checkpoint-every", "1"]),
])
def test_file_size_limit_is_one_error(tmp_path, what, options):
    out = tmp_path / "model.h5"
    command = [sys.executable, "-c", LIMITED, "--quiet", "--lam", "1e-3", "--out", str(out),
               *(option.format(dir=tmp_path) for option in options)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                               stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=REPO))
    one_error(completed, f"cannot write the {what}", "File too large")
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    """Also through the Python API: InputError, the old model and checkpoint unchanged, no temporary."""
    model, checkpoint = str(tmp_path / "model.h5"), str(tmp_path / "state.h5")
    save_model(model, np.arange(3.0), 0.0, {"lam": 1.0}, {})
    save_checkpoint(checkpoint, {"x": np.arange(3.0)}, {"iteration": 1})

    def full(descriptor):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(InputError, match="model.h5: cannot write the model file: No space left"):
        save_model(model, np.arange(5.0), 0.0, {"lam": 2.0}, {})
    with pytest.raises(InputError, match="state.h5: cannot write the checkpoint: No space left"):
        save_checkpoint(checkpoint, {"x": np.arange(5.0)}, {"iteration": 2})
    assert load_model(model).attrs["lam"] == 1.0 and len(load_checkpoint(checkpoint)[0]["x"]) == 3
    assert sorted(os.listdir(tmp_path)) == ["model.h5", "state.h5"]


@pytest.mark.parametrize("option", ["--out", "--checkpoint", "--log-json"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_second_job_on_the_same_file_stops(tmp_path, option, ranks):
    """Two jobs with the same --out, --checkpoint or --log-json both exited 0, the log interleaved."""
    path = str(tmp_path / "shared")
    with OutputClaim({option: path}, "the first job"):
        others = {"--out": str(tmp_path / "model.h5")}
        others[option] = path
        completed, _ = run_ranks(ranks, [*TRAIN, *[x for pair in others.items() for x in pair]], timeout=120)
        one_error(completed, f"{path}: in use by the first job (pid {os.getpid()} on ", lock_name(path))
        assert not os.path.exists(path) and not os.path.exists(tmp_path / "model.h5")
    assert leftovers(str(tmp_path)) == []
    completed, _ = run_ranks(ranks, [*TRAIN, *[x for pair in others.items() for x in pair]], timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert leftovers(str(tmp_path)) == []


def test_claims(tmp_path):
    path = str(tmp_path / "model.h5")
    with pytest.raises(UsageError, match="given to both --out and --checkpoint"):
        with OutputClaim({"--out": path, "--checkpoint": str(tmp_path / "." / "model.h5")}, "job"):
            pass
    with open(lock_name(path), "w") as f:
        f.write("a killed job\n")  # a lock file nobody holds is taken over
    with OutputClaim({"--out": path, "--log-json": None}, "job"):
        with open(lock_name(path)) as f:
            assert f.read().startswith(f"job (pid {os.getpid()} on ")
        with pytest.raises(InputError, match="model.h5: in use by job"):
            with OutputClaim({"--out": path}, "other"):
                pass
    assert os.listdir(tmp_path) == []


# ---- checkpoints are checked before a run resumes from them ----

OPTIONS = dict(solver="bmrm", lam=1e-3, rel_epsilon=1e-5)  # BMRM's checkpoint; the demo data: about 70 iterations


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("checkpoint") / "state.h5")
    run(max_iter=30, checkpoint=path, **OPTIONS)
    return path


def forged(saved, tmp_path, change):
    """A copy of the checkpoint `saved` with ``change(state)`` applied."""
    state, meta = load_checkpoint(saved)
    change(state)
    path = str(tmp_path / "forged.h5")
    save_checkpoint(path, state, meta)
    return path


def shift_planes(state):
    # Enough to lift the bundle's bound over J(best_w) (the gap at iteration 30 is about 0.05).
    state["bundle"]["b"] += 0.2


def claim_bound(state):
    state["history"]["lower_bound"][-1] = state["best_objective"] + 1e-3


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(best_w=s["w"]), "best_objective .* is not the objective at best_w"),
    (lambda s: s.update(best_w=s["best_w"] * 1.01, best_objective=s["best_objective"] * 0.99),
     "best_objective .* is not the objective at best_w"),
    (shift_planes, "plane \\d+ of bundle lies above the empirical risk at best_w"),
    (claim_bound, "the history's last lower bound, .*, exceeds the objective at best_w"),
    (lambda s: s["bundle"]["gram"].__imul__(0.5), "bundle/gram is not the Gram matrix of bundle/A"),
    (lambda s: s.update(iteration=10**9), "iteration 1000000000 does not match its history of 30 rows"),
    (lambda s: s["bundle"]["A"].__setitem__((0, 3), np.nan), "bundle/A holds NaN"),
    (lambda s: s["alpha"].__setitem__(0, np.inf), "alpha holds an infinite value"),
    (lambda s: s.update(best_w=s["best_w"][:-1]), "best_w has shape \\(29,\\), expected \\(30,\\)"),
    (lambda s: s["bundle"].update(A=s["bundle"]["A"][:, :-1]), "bundle/A has shape .*, expected \\(n, 30\\)"),
    (lambda s: s["bundle"].update(b=s["bundle"]["b"][:-1]), "bundle/A has shape .*, expected"),
    (lambda s: s.pop("best_w"), "the checkpoint has no best_w"),
    (lambda s: s["history"].pop("gap"), "the checkpoint has no history/gap"),
    (lambda s: s.pop("alpha"), "the checkpoint has no alpha"),
    (lambda s: s["bundle"].pop("idle"), "the checkpoint has no bundle/idle"),
], ids=["best_w", "best_w-and-objective", "plane-offsets", "claimed-bound", "gram", "iteration", "nan",
        "inf", "best_w-shape", "plane-shape", "offsets-shape", "no-best_w", "no-history-column", "no-alpha",
        "no-idle"])
def test_a_forged_checkpoint_is_refused(saved, tmp_path, change, message):
    """Each gave an internal error or a run claiming a gap it does not have."""
    path = forged(saved, tmp_path, change)
    with pytest.raises(CollectiveError, match=f"{path}: {message}"):
        run(resume=path, **OPTIONS)


def test_a_forged_checkpoint_stops_every_rank(saved, tmp_path):
    path = forged(saved, tmp_path, lambda s: s.update(iteration=10**9))
    completed, _ = run_ranks(2, [*TRAIN, "--solver", "bmrm", "--lam", "1e-3", "--rel-epsilon", "1e-5", "--resume", path,
                                 "--out", str(tmp_path / "m.h5")], timeout=120)
    one_error(completed, f"--resume {path}: iteration 1000000000 does not match its history of 30 rows")
    assert not os.path.exists(tmp_path / "m.h5")


def test_an_intact_checkpoint_resumes(saved, tmp_path):
    path = forged(saved, tmp_path, lambda s: None)
    full, _, _ = run(**OPTIONS)
    resumed, _, _ = run(resume=path, **OPTIONS)
    np.testing.assert_array_equal(resumed.w, full.w)


# ---- shards ----

def test_duplicate_csr_indices_are_refused(tmp_path):
    """A shard written by another tool (write_shards sums duplicates) had them summed silently by X @ w."""
    from prbmrm.distributed.comm import SerialComm
    from prbmrm.io import load_local, write_shards

    X = sp.random(40, 12, density=0.5, format="csr", random_state=0)
    y = np.where(np.arange(40) % 2, 1.0, -1.0)
    write_shards(X, y, tmp_path, 2)
    with h5py.File(tmp_path / "part-00000.h5", "r+") as f:  # unsorted but unique indices: fine
        indptr = f["X/indptr"][()]
        for name in ("X/indices", "X/data"):
            values = f[name][()]
            f[name][:] = np.concatenate([values[a:b][::-1] for a, b in zip(indptr[:-1], indptr[1:])])
    np.testing.assert_array_equal(load_local(str(tmp_path), SerialComm(), dense=False).X.toarray(), X.toarray())
    with h5py.File(tmp_path / "part-00001.h5", "r+") as f:
        indptr, indices = f["X/indptr"][()], f["X/indices"][()]
        a, b = indptr[6], indptr[7]  # row 7 of the shard
        assert b - a >= 2
        indices[b - 1] = indices[a]
        f["X/indices"][:] = indices
    with pytest.raises(CollectiveError, match=f"part-00001.h5: row 7 gives column {indices[a]} twice"):
        load_local(str(tmp_path), SerialComm())


@pytest.mark.parametrize("dense", [False, True])
def test_duplicate_check_takes_empty_rows_and_descending_row_starts(tmp_path, dense):
    """Rows that start below the index their predecessor ended on pass, empty rows (first, inner, last) too;
    a column given twice is found in the row after empty ones, against a brute-force count."""
    from prbmrm.distributed.comm import SerialComm
    from prbmrm.io import load_local, write_shards

    rows = [[], [], [5, 9], [0, 1], [], [3], [2, 7, 8], []]
    X = sp.csr_matrix((np.arange(1.0, 1 + sum(map(len, rows))), np.concatenate(rows).astype(np.int32),
                       np.cumsum([0] + [len(r) for r in rows])), shape=(len(rows), 10))
    y = np.where(np.arange(len(rows)) % 2, 1.0, -1.0)
    write_shards(X, y, tmp_path, 1)
    got = load_local(str(tmp_path), SerialComm(), dense=dense).X
    np.testing.assert_array_equal(got if dense else got.toarray(), X.toarray())
    with h5py.File(tmp_path / "part-00000.h5", "r+") as f:
        indptr, indices = f["X/indptr"][()], f["X/indices"][()]
        indices[indptr[6] + 2] = indices[indptr[6]]  # row 7 (after the empty row 5): 2, 7, 2
        f["X/indices"][:] = indices
    twice = [i + 1 for i in range(len(rows))
             if len(set(indices[indptr[i]:indptr[i + 1]])) < indptr[i + 1] - indptr[i]]
    assert twice == [7]
    with pytest.raises(CollectiveError, match="part-00000.h5: row 7 gives column 2 twice"):
        load_local(str(tmp_path), SerialComm(), dense=dense)


SHARD_LIMITED = """import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.argv[0] = "prbmrm.cli.shard"
runpy.run_module("prbmrm.cli.shard", run_name="__main__")
"""


def shard_input(tmp_path, kind):
    """An input of about 100 KB: SVMlight rows, or ragged examples (a structured ``.npz``)."""
    rng = np.random.default_rng(0)
    if kind == "svmlight":
        path = tmp_path / "in.svm"
        path.write_text("".join(f"{rng.choice([-1, 1])} " + " ".join(f"{j + 1}:{rng.normal():.17g}" for j in range(20))
                                + "\n" for _ in range(300)))
        return path
    path = tmp_path / "in.npz"
    np.savez(path, x_values=rng.normal(size=(3000, 5)), x_offsets=np.arange(0, 3001, 10),
             y_values=rng.integers(0, 3, 3000), y_offsets=np.arange(0, 3001, 10))
    return path


@pytest.mark.parametrize("kind", ["svmlight", "structured"])
@pytest.mark.parametrize("existing", [False, True])
def test_shards_past_a_file_size_limit_are_one_error(tmp_path, kind, existing):
    """Shards were written by HDF5 straight to disk: past the limit, h5py tracebacks and exit 0."""
    source, out = shard_input(tmp_path, kind), tmp_path / "out"
    before = {}
    if existing:  # a previous set, small enough: replacing it must leave it as it was
        subprocess.run([sys.executable, "-m", "prbmrm.cli.shard", str(source), "--parts", "40", "--out", str(out),
                        "--quiet"], check=True, capture_output=True, stdin=subprocess.DEVNULL,
                       env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
        before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    command = [sys.executable, "-c", SHARD_LIMITED, str(source), "--parts", "2", "--out", str(out), "--overwrite"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                               stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=REPO))
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prbmrm.cli.shard: error: "), completed.stderr
    assert f"{out}: cannot write shard files: File too large" in lines[0], lines[0]
    if existing:
        assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    else:
        assert not os.path.exists(out)
    assert leftovers(tmp_path) == [] and leftovers(out) == []
