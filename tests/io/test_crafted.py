"""Crafted files an attacker would try: each one stops the command line with exit 2 and one line naming the file.

Each input here once gave a traceback (exit 1), tried to allocate terabytes, or was accepted silently.
"""

import io
import re
import zipfile

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from helpers import REPO, run_ranks
from prbmrm.io import write_shards


def cli(module, *args):
    completed, _ = run_ranks(1, ["-m", f"prbmrm.cli.{module}", *map(str, args)], timeout=120)
    return completed


def one_line(completed, path, problem):
    """Exit 2, no traceback, exactly one line on stderr, naming `path` and matching `problem`."""
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr, completed.stderr[-3000:]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert str(path) in lines[0], lines[0]
    assert re.search(problem, lines[0]), lines[0]
    return lines[0]


@pytest.fixture
def shards(tmp_path):
    """A small sparse shard set: 40 rows, 6 features, binary labels."""
    rng = np.random.default_rng(0)
    X = sp.random(40, 6, density=0.5, random_state=1, format="csr")
    y = np.where(rng.random(40) < 0.5, -1.0, 1.0)
    write_shards(X, y, tmp_path / "shards", 1)
    return tmp_path / "shards"


def test_a_feature_index_beyond_2_to_the_31_is_named_with_its_line(tmp_path):
    path = tmp_path / "big.svm"
    path.write_text("1 1:0.5 3:1\n-1 2:1 2147483648:1\n")
    one_line(cli("shard", path, "--parts", 1, "--out", tmp_path / "out"), path,
             r"line 2: a feature index or query id too large \(feature indices must be below 2\^31\)")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_an_npz_member_declaring_2_to_the_40_values_is_refused_before_allocating(tmp_path):
    path = tmp_path / "big.npz"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (2**40,)})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("X.npy", _npy(np.eye(3)))
        archive.writestr("y.npy", header.getvalue() + bytes(24))  # 3 values stored of the 2^40 declared
    one_line(cli("shard", path, "--parts", 1, "--out", tmp_path / "out"), path,
             r"y.npy declares \(1099511627776,\) values of float64 \(8796093022208 bytes\) but stores 24 bytes")


def _npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_a_shard_declaring_2_to_the_40_values_is_refused_before_allocating(shards, tmp_path):
    part = shards / "part-00000.h5"
    with h5py.File(part, "r+") as f:
        n = f["X/indptr"].shape[0] - 1
        for name in ("data", "indices"):
            del f[f"X/{name}"]
        # Declared, never written: HDF5 stores nothing and reads fill values (8 TiB of them).
        f["X"].create_dataset("data", shape=(2**40,), dtype=np.float64)
        f["X"].create_dataset("indices", shape=(2**40,), dtype=np.int64)
        indptr = np.linspace(0, 2**40, n + 1).astype(np.int64)
        indptr[-1] = 2**40
        f["X/indptr"][...] = indptr
    assert part.stat().st_size < 1 << 20
    one_line(cli("train", "--data", shards, "--out", tmp_path / "m.h5"), part,
             r"/X/data declares \(1099511627776,\) values of float64 \(8.0 TiB\) but stores 0 bytes")


def test_a_shard_declaring_2_to_the_40_features_is_refused_before_allocating(shards, tmp_path):
    part = shards / "part-00000.h5"
    with h5py.File(part, "r+") as f:
        f.attrs["n_features"] = np.int64(2**40)
        f["X"].attrs["shape"] = np.array([f["X"].attrs["shape"][0], 2**40], dtype=np.int64)
    one_line(cli("train", "--data", shards, "--out", tmp_path / "m.h5"), part,
             r"n_features = 1099511627776 \(the model's vectors\) needs 24.0 TiB, more than the .* of memory "
             r"available")


def test_a_shard_with_float_feature_indices_is_refused(shards, tmp_path):
    part = shards / "part-00000.h5"
    with h5py.File(part, "r+") as f:
        indices = f["X/indices"][()]
        del f["X/indices"]
        f["X"].create_dataset("indices", data=indices.astype(np.float64) + 0.25)
    one_line(cli("train", "--data", shards, "--out", tmp_path / "m.h5"), part,
             r"/X/indices has type float64, not integers")


def test_a_shard_whose_counts_are_not_integers_is_refused(shards, tmp_path):
    part = shards / "part-00000.h5"
    with h5py.File(part, "r+") as f:
        f.attrs["n_examples"] = "forty"
    one_line(cli("train", "--data", shards, "--out", tmp_path / "m.h5"), part,
             r"attribute n_examples is 'forty', not an integer")


@pytest.fixture
def checkpoint(shards, tmp_path):
    path = tmp_path / "ck.h5"
    # The proximal method, still short of the gap after 5 iterations here, leaves a checkpoint (the default's
    # dual coordinate descent certifies these 40 rows within them, and a finished run keeps none).
    done = cli("train", "--data", shards, "--lam", 0.1, "--solver", "proximal", "--max-iter", 5, "--quiet",
               "--checkpoint", path, "--out", tmp_path / "first.h5")
    assert done.returncode == 0, done.stderr
    return path


def test_a_checkpoint_attribute_that_is_not_json_text_is_refused(shards, tmp_path, checkpoint):
    with h5py.File(checkpoint, "r+") as f:
        f.attrs["options"] = np.arange(3)
    one_line(cli("train", "--data", shards, "--lam", 0.1, "--solver", "proximal", "--quiet", "--resume", checkpoint,
                 "--out", tmp_path / "m.h5"), checkpoint,
             r"the checkpoint's attribute options is not the JSON text of a checkpoint")


def test_a_checkpoint_dataset_declaring_more_than_it_stores_is_refused(shards, tmp_path, checkpoint):
    with h5py.File(checkpoint, "r+") as f:
        del f["state/best_w"]
        f["state"].create_dataset("best_w", shape=(2**40,), dtype=np.float64)
    one_line(cli("train", "--data", shards, "--lam", 0.1, "--solver", "proximal", "--quiet", "--resume", checkpoint,
                 "--out", tmp_path / "m.h5"), checkpoint, r"/state/best_w of the checkpoint declares")


def test_a_model_whose_w_is_not_numeric_is_refused(shards, tmp_path):
    model = tmp_path / "m.h5"
    assert cli("train", "--data", shards, "--lam", 0.1, "--quiet", "--out", model).returncode == 0
    with h5py.File(model, "r+") as f:
        size = f["w"].shape[0]
        del f["w"]
        f.create_dataset("w", data=np.array([b"w"] * size))
    one_line(cli("predict", "--model", model, "--data", shards), model,
             r"/w of the model file has type \|S1, not a number type")


def test_a_model_whose_bias_is_text_is_refused(shards, tmp_path):
    model = tmp_path / "m.h5"
    assert cli("train", "--data", shards, "--lam", 0.1, "--quiet", "--out", model).returncode == 0
    with h5py.File(model, "r+") as f:
        f.attrs["bias"] = "zero"
    one_line(cli("predict", "--model", model, "--data", shards), model,
             r"the model file's attribute bias is 'zero', not finite numbers")


NO_SPACE = """
import errno, os, sys
def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
os.pwrite = full
from prbmrm.cli.common import run
from prbmrm.cli.train import main
sys.exit(run(main, "prbmrm.cli.train", sys.argv[1:]))
"""


def test_a_full_disk_while_claiming_the_output_lock_names_the_file(shards, tmp_path):
    # The lock file is created (an inode) but its line cannot be written: ENOSPC, as on a full disk.
    model = tmp_path / "m.h5"
    completed, _ = run_ranks(1, ["-c", NO_SPACE, "--data", str(shards), "--quiet", "--out", str(model)])
    line = one_line(completed, model, r"cannot write the --out file: cannot write its lock file .*\.m\.h5\.lock "
                                      r"\(No space left on device\)")
    assert "Errno" not in line
    assert not model.exists() and not (tmp_path / ".m.h5.lock").exists()


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "ck.key"
    path.write_bytes(bytes(range(7, 39)))
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("edit", ["state", "attribute", "added plane"])
def test_a_checkpoint_edited_without_the_key_is_refused_when_a_key_is_given(shards, tmp_path, key, edit):
    checkpoint = tmp_path / "ck.h5"
    done = cli("train", "--data", shards, "--lam", 0.1, "--solver", "proximal", "--max-iter", 5, "--quiet",
               "--checkpoint", checkpoint, "--checkpoint-key", key, "--out", tmp_path / "first.h5")
    assert done.returncode == 0, done.stderr
    with h5py.File(checkpoint, "r") as f:
        assert len(f.attrs["hmac_sha256"]) == 64
    resume = ("train", "--data", shards, "--lam", 0.1, "--solver", "proximal", "--max-iter", 8, "--quiet",
              "--resume", checkpoint, "--checkpoint-key", key, "--out", tmp_path / "m.h5")
    done = cli(*resume)
    assert done.returncode == 0, done.stderr  # untouched: resumed
    (tmp_path / "m.h5").unlink()
    with h5py.File(checkpoint, "r+") as f:
        if edit == "state":
            f["state/best_objective"][()] = 0.5 * f["state/best_objective"][()]
        elif edit == "attribute":
            f.attrs["iteration"] = "4"
        else:
            group = f["state"][next(name for name in ("bundle", "planes", "lower") if name in f["state"])]
            for name, extra in (("A", group["A"][:1]), ("b", [-1.0])):  # one more plane
                rows = group[name][()]
                del group[name]
                group.create_dataset(name, data=np.concatenate([rows, extra]))
    one_line(cli(*resume), checkpoint, r"the checkpoint's authentication tag does not match the checkpoint key: it "
                                       r"was changed after it was written, or written with another key")
    assert not (tmp_path / "m.h5").exists()


def test_a_checkpoint_without_a_tag_and_a_key_readable_by_others_are_refused(shards, tmp_path, checkpoint, key):
    resume = ("train", "--data", shards, "--lam", 0.1, "--solver", "proximal", "--max-iter", 8, "--quiet",
              "--resume", checkpoint, "--out", tmp_path / "m.h5")
    one_line(cli(*resume, "--checkpoint-key", key), checkpoint, r"the checkpoint has no authentication tag")
    # The key from the environment, as from --checkpoint-key.
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.train", *map(str, resume[1:])],
                             env={"PRBMRM_CHECKPOINT_KEY": str(key)})
    one_line(completed, checkpoint, r"the checkpoint has no authentication tag")
    key.chmod(0o644)
    one_line(cli(*resume, "--checkpoint-key", key), key,
             r"--checkpoint-key .*ck.key: the checkpoint key is accessible to others \(mode 0644\)")
