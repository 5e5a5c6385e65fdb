"""Tests of prbmrm.io (shard format, conversion, validation, loading) and prbmrm.cli.shard."""

import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from prbmrm import io as pio
from prbmrm.io import shards
from prbmrm.distributed.comm import SerialComm
from prbmrm.errors import CollectiveError, InputError, PrbmrmError

from helpers import REPO, data_path as shared, mpiexec


@pytest.fixture(scope="module")
def dna():
    return pio.read_input(shared("dna.scale.xz"))


@pytest.fixture(scope="module")
def mq2008():
    return pio.read_input(shared("mq2008_subset_vali.txt.xz"))


@pytest.fixture(scope="module")
def yeast():
    return pio.read_input(shared("yeast_train.xz"), multilabel=True)


@pytest.fixture(scope="module")
def housing():
    return pio.read_input(shared("housing.xz"))


class FakeComm(SerialComm):
    """A serial communicator that pretends to be rank `rank` of `size`."""

    def __init__(self, rank=0, size=3):
        self.rank = rank
        self.size = size


def write_text(path, text):
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    return str(path)


def same_matrix(A, B):
    A = A.toarray() if sp.issparse(A) else np.asarray(A)
    B = B.toarray() if sp.issparse(B) else np.asarray(B)
    return A.shape == B.shape and np.array_equal(A, B)


def indicator(label_sets, classes):
    Y = np.zeros((len(label_sets), len(classes)), dtype=np.int8)
    for i, s in enumerate(label_sets):
        for c in s:
            Y[i, list(classes).index(c)] = 1
    return Y


def shard_rows(paths):
    rows = []
    for p in paths:
        with h5py.File(p, "r") as f:
            rows.append(int(f.attrs["n_examples"]))
    return rows


# --------------------------------------------------------------------------
# Reading real data
# --------------------------------------------------------------------------

def test_read_real_data(dna, mq2008, yeast, housing):
    X, y, qid = dna
    assert sp.isspmatrix_csr(X) and X.shape == (2000, 180) and X.dtype == np.float64
    assert qid is None and set(np.unique(y)) == {1.0, 2.0, 3.0}
    X, y, qid = mq2008
    assert X.shape == (1000, 46) and qid.dtype == np.int64 and len(np.unique(qid)) == 69
    X, y, qid = yeast
    assert X.shape == (1500, 103) and isinstance(y, list) and isinstance(y[0], tuple)
    X, y, qid = housing
    assert X.shape == (506, 13) and pio.infer_label_kind(y)[0] == "real"


def test_several_inputs_are_concatenated(dna):
    X, y, qid = pio.read_input([shared("dna.scale.xz"), shared("dna.scale.t.xz")])
    assert X.shape == (2000 + 1186, 180) and y.shape == (3186,)
    assert same_matrix(X[:2000], dna[0])


def test_one_based_and_n_features(tmp_path):
    p = write_text(tmp_path / "a.txt", "1 1:2 3:4\n-1 2:1\n")
    X, y, _ = pio.read_input(p)
    assert same_matrix(X, [[2, 0, 4], [0, 1, 0]])
    X, _, _ = pio.read_input(p, n_features=5)
    assert X.shape == (2, 5)
    with pytest.raises(InputError, match=r"a\.txt: has 3 features, more than n_features=2"):
        pio.read_input(p, n_features=2)


def test_compressed_svmlight(tmp_path):
    import bz2
    import gzip
    import lzma

    text = b"1 1:2 3:4\n-1 2:1\n"
    for suffix, opener in ((".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)):
        p = str(tmp_path / f"in.txt{suffix}")
        with opener(p, "wb") as f:
            f.write(text)
        X, y, _ = pio.read_input(p)
        assert same_matrix(X, [[2, 0, 4], [0, 1, 0]]) and list(y) == [1, -1]


# --------------------------------------------------------------------------
# Round trips: shard, then load every shard, equals the input exactly
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["dna", "mq2008", "yeast", "housing"])
@pytest.mark.parametrize("parts", [1, 3, 4])
def test_round_trip(name, parts, request, tmp_path):
    X, y, qid = request.getfixturevalue(name)
    multilabel = name == "yeast"
    paths = pio.write_shards(X, y, tmp_path / "out", parts, qid=qid, source=name,
                              multilabel=multilabel)
    assert [os.path.basename(p) for p in paths] == [f"part-{i:05d}.h5" for i in range(parts)]
    L = pio.load_local(tmp_path / "out", SerialComm(), dense=False)
    assert sp.isspmatrix_csr(L.X)
    assert L.X.data.dtype == np.float64
    assert L.X.indices.dtype == np.int32 and L.X.indptr.dtype == np.int32
    assert same_matrix(L.X, X)
    assert L.n_local == L.n_examples_total == X.shape[0] and L.n_features == X.shape[1]
    assert L.files == paths and L.row_offset == 0 and not L.bias
    if multilabel:
        assert L.label_kind == "multilabel" and L.y.dtype == np.int8
        np.testing.assert_array_equal(L.classes, np.arange(14.0))
        np.testing.assert_array_equal(L.y, indicator(y, L.classes))
    else:
        assert L.y.dtype == np.float64 and np.array_equal(L.y, y)
    if qid is None:
        assert L.qid is None
    else:
        assert L.qid.dtype == np.int64 and np.array_equal(L.qid, qid)


def test_shard_file_format(dna, tmp_path):
    X, y, _ = dna
    paths = pio.write_shards(X, y, tmp_path, 2, source="dna.scale.xz")
    with h5py.File(paths[1], "r") as f:
        a = f.attrs
        assert a["format"] == "prbmrm-shard" and a["format_version"] == 1
        assert a["n_features"] == 180 and a["n_examples_total"] == 2000
        assert a["shard_index"] == 1 and a["shard_count"] == 2
        assert a["label_kind"] == "integer" and a["source"] == "dna.scale.xz"
        np.testing.assert_array_equal(a["classes"], [1.0, 2.0, 3.0])
        g = f["X"]
        assert g.attrs["encoding-type"] == "csr_matrix"
        assert g.attrs["encoding-version"] == "0.1.0"
        assert tuple(g.attrs["shape"]) == (a["n_examples"], 180)
        assert g["data"].dtype == np.float64 and g["indices"].dtype == np.int32
        assert g["indptr"].dtype == np.int64
        assert g["data"].compression is None and g["data"].chunks is None
        assert f["y"].dtype == np.float64 and "qid" not in f


def test_bias_column(dna, tmp_path):
    X, y, _ = dna
    pio.write_shards(X, y, tmp_path / "s", 3)
    L = pio.load_local(tmp_path / "s", SerialComm(), bias=True)
    assert L.bias and L.n_features == 180 and L.X.shape == (2000, 181)
    assert L.X.indices.dtype == np.int32 and L.X.indptr.dtype == np.int32
    L.X.check_format(full_check=True)
    assert same_matrix(L.X[:, :180], X) and np.all(L.X[:, 180].toarray() == 1)
    pio.write_shards(X, y, tmp_path / "d", 3, dense=True)
    L = pio.load_local(tmp_path / "d", SerialComm(), bias=True)
    assert isinstance(L.X, np.ndarray) and L.X.flags.c_contiguous and L.X.shape == (2000, 181)
    assert np.array_equal(L.X[:, :180], X.toarray()) and np.all(L.X[:, 180] == 1)


# --------------------------------------------------------------------------
# Balancing and queries
# --------------------------------------------------------------------------

def test_balanced_by_nonzeros(dna, tmp_path):
    X, y, _ = dna
    paths = pio.write_shards(X, y, tmp_path, 7)
    nnz = [shards.shard_summary(p)["nnz"] for p in paths]
    assert sum(nnz) == X.nnz and max(nnz) / min(nnz) < 1.05


def test_balance_with_skewed_rows(tmp_path):
    # Rows of very different lengths: each boundary sits where the
    # cumulative cost (nnz + 1 per row) is closest to k/P of the total.
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 60, size=300) ** 2 // 30
    rows = [sorted(rng.choice(200, size=k, replace=False)) for k in lengths]
    X = sp.csr_matrix((np.ones(lengths.sum()), np.concatenate(rows).astype(int),
                       np.r_[0, np.cumsum(lengths)]), shape=(300, 200))
    y = rng.integers(0, 2, size=300).astype(float)
    parts = 6
    paths = pio.write_shards(X, y, tmp_path, parts)
    cum = np.r_[0, np.cumsum(lengths + 1)]
    bounds = np.r_[0, np.cumsum(shard_rows(paths))]
    for k in range(1, parts):
        target = cum[-1] * k / parts
        best = np.min(np.abs(cum - target))
        assert abs(cum[bounds[k]] - target) == best
    L = pio.load_local(tmp_path, SerialComm())
    assert same_matrix(L.X, X)  # contiguous blocks, in order


def test_dense_rows_split_evenly(tmp_path):
    X = np.ones((10, 3))
    paths = pio.write_shards(X, np.arange(10.0), tmp_path, 3)
    assert shard_rows(paths) in ([3, 4, 3], [3, 3, 4], [4, 3, 3])


@pytest.mark.parametrize("parts", [2, 5, 69])
def test_queries_never_split(mq2008, parts, tmp_path):
    X, y, qid = mq2008
    paths = pio.write_shards(X, y, tmp_path, parts, qid=qid)
    owner = {}
    for i, p in enumerate(paths):
        with h5py.File(p, "r") as f:
            for q in np.unique(f["qid"][()]):
                assert q not in owner, f"query {q} split over shards {owner[q]} and {i}"
                owner[int(q)] = i
    assert len(owner) == 69


def test_more_parts_than_queries(mq2008, tmp_path):
    X, y, qid = mq2008
    with pytest.raises(InputError, match="cannot split 69 queries into 70 parts"):
        pio.write_shards(X, y, tmp_path / "out", 70, qid=qid)
    assert not os.path.exists(tmp_path / "out")


def test_query_in_two_runs(tmp_path):
    X = np.ones((5, 2))
    with pytest.raises(InputError, match=r"qid 7 appears in two separate runs of rows "
                                         r"\(rows 1-2 and 5-5\)"):
        pio.write_shards(X, np.zeros(5), tmp_path, 2, qid=[7, 7, 8, 8, 7])


# --------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------

def test_positive_class(dna, tmp_path):
    X, y, _ = dna
    pio.write_shards(X, y, tmp_path, 3, positive=3)
    L = pio.load_local(tmp_path, SerialComm())
    assert L.label_kind == "binary"
    np.testing.assert_array_equal(L.classes, [-1.0, 1.0])
    np.testing.assert_array_equal(L.y, np.where(y == 3, 1.0, -1.0))
    with h5py.File(L.files[0], "r") as f:
        assert f.attrs["positive"] == 3.0


def test_positive_label_absent(dna, tmp_path):
    X, y, _ = dna
    with pytest.raises(InputError, match=r"the positive label 7 does not occur in the data "
                                         r"\(labels: 1, 2, 3\)"):
        pio.write_shards(X, y, tmp_path, 2, positive=7)


@pytest.mark.parametrize("y, kind, classes", [
    ([-1, 1, 1, -1], "binary", [-1, 1]),
    ([0, 1, 0], "binary", [0, 1]),
    ([1, 2, 3, 2], "integer", [1, 2, 3]),
    ([5, 5], "integer", [5]),
    ([0.5, 1, 2], "real", None),
    ([24.0, 21.6], "real", None),
])
def test_infer_label_kind(y, kind, classes):
    got_kind, got_classes = pio.infer_label_kind(np.array(y, dtype=float))
    assert got_kind == kind
    if classes is None:
        assert got_classes is None
    else:
        assert got_classes.dtype == np.float64
        np.testing.assert_array_equal(got_classes, classes)


def test_infer_label_kind_multilabel():
    kind, classes = pio.infer_label_kind([(2.0, 3.0), (), (7.0,)], multilabel=True)
    assert kind == "multilabel" and list(classes) == [2.0, 3.0, 7.0]
    kind, classes = pio.infer_label_kind(np.array([[0, 1, 1], [1, 0, 0]]))
    assert kind == "multilabel" and list(classes) == [0.0, 1.0, 2.0]
    with pytest.raises(InputError, match="non-finite"):
        pio.infer_label_kind([1.0, np.nan])


# --------------------------------------------------------------------------
# Dense, sparse, npz and csv
# --------------------------------------------------------------------------

def test_dense_and_sparse_layouts(housing, tmp_path):
    X, y, _ = housing
    pio.write_shards(X, y, tmp_path / "d", 2, dense=True)
    with h5py.File(tmp_path / "d" / "part-00000.h5", "r") as f:
        assert isinstance(f["X"], h5py.Dataset) and f["X"].dtype == np.float64
    L = pio.load_local(tmp_path / "d", SerialComm())
    assert isinstance(L.X, np.ndarray) and L.X.flags.c_contiguous
    assert np.array_equal(L.X, X.toarray()) and np.array_equal(L.y, y)
    # dense input -> dense by default; forced sparse
    Xd = X.toarray()
    pio.write_shards(Xd, y, tmp_path / "dd", 2)
    assert isinstance(pio.load_local(tmp_path / "dd", SerialComm()).X, np.ndarray)
    pio.write_shards(Xd, y, tmp_path / "s", 2, dense=False)
    L = pio.load_local(tmp_path / "s", SerialComm(), dense=False)
    assert sp.isspmatrix_csr(L.X) and same_matrix(L.X, X)


@pytest.mark.parametrize("bias", [False, True])
def test_dense_enough_csr_is_held_dense(bias, tmp_path):
    # CSR shards of density >= DENSE_DENSITY (over all shards) load as a dense array,
    # read a slice at a time; sparser ones stay CSR unless dense=True.
    rng = np.random.default_rng(3)
    n, d = 300, 20
    for density in (pio.DENSE_DENSITY + 0.05, pio.DENSE_DENSITY - 0.1):
        X = sp.random(n, d, density=density, format="csr", random_state=rng)
        y = rng.choice([-1.0, 1.0], n)
        out = tmp_path / str(density)
        pio.write_shards(X, y, out, 3)
        expected = np.hstack([X.toarray(), np.ones((n, int(bias)))])
        for dense in (None, True, False):
            L = pio.load_local(out, SerialComm(), bias=bias, dense=dense)
            held_dense = dense if dense is not None else density >= pio.DENSE_DENSITY
            assert isinstance(L.X, np.ndarray) == held_dense and L.blocks[-1] == n
            got = L.X if held_dense else L.X.toarray()
            assert np.array_equal(got, expected) and np.array_equal(L.y, y)
            if held_dense:
                assert L.X.flags.c_contiguous and L.X.dtype == np.float64
            M = pio.split_local(X, y, SerialComm(), bias=bias, dense=dense)
            assert isinstance(M.X, np.ndarray) == held_dense
            assert np.array_equal(M.X if held_dense else M.X.toarray(), expected)


def test_dense_read_of_csr_reports_the_row(tmp_path):
    X = sp.csr_matrix(np.arange(1.0, 13.0).reshape(4, 3))
    paths = pio.write_shards(X, np.array([1.0, -1.0, 1.0, -1.0]), tmp_path, 1)
    with h5py.File(paths[0], "a") as f:
        f["X/data"][7] = np.nan  # row 3
    with pytest.raises(CollectiveError, match=r"part-00000\.h5: row 3 has a non-finite feature value"):
        pio.load_local(tmp_path, SerialComm(), dense=True)


def test_mixed_dense_and_sparse_shards_are_refused(tmp_path):
    # prbmrm.cli.shard writes one layout per set; a mix means sets were mixed.
    rng = np.random.default_rng(1)
    X = rng.uniform(1, 2, size=(40, 5))  # no zeros: same balance dense or sparse
    y = rng.integers(0, 2, 40).astype(float)
    pio.write_shards(X, y, tmp_path / "s", 4, dense=False)
    pio.write_shards(X, y, tmp_path / "d", 4, dense=True)
    os.replace(tmp_path / "d" / "part-00002.h5", tmp_path / "s" / "part-00002.h5")
    with pytest.raises(CollectiveError) as info:
        pio.load_local(tmp_path / "s", SerialComm(), bias=True)
    assert str(info.value) == (
        f"shards disagree on the layout of /X: {tmp_path / 's' / 'part-00000.h5'} has sparse, "
        f"{tmp_path / 's' / 'part-00002.h5'} has dense "
        "(shard files of different conversions mixed?)")


def test_npz_inputs(tmp_path):
    rng = np.random.default_rng(2)
    Xd = rng.normal(size=(12, 4))
    Xd[Xd < 0] = 0
    y = rng.integers(1, 4, 12).astype(float)
    qid = np.repeat([3, 1, 2], 4)
    np.savez(tmp_path / "dense.npz", X=Xd, y=y, qid=qid)
    X, y2, q2 = pio.read_input(tmp_path / "dense.npz")
    assert isinstance(X, np.ndarray) and np.array_equal(X, Xd)
    assert np.array_equal(y2, y) and np.array_equal(q2, qid)
    S = sp.csr_matrix(Xd)
    np.savez(tmp_path / "sparse.npz", data=S.data, indices=S.indices, indptr=S.indptr,
             shape=np.array(S.shape), format=np.array(b"csr"), y=y)
    X, y2, q2 = pio.read_input(tmp_path / "sparse.npz")
    assert sp.isspmatrix_csr(X) and same_matrix(X, Xd) and q2 is None
    paths = pio.write_shards(X, y2, tmp_path / "out", 2)
    assert same_matrix(pio.load_local(paths, SerialComm()).X, Xd)
    Y = np.array([[1, 0, 1]] * 6 + [[0, 1, 0]] * 6, dtype=np.int8)
    np.savez(tmp_path / "ml.npz", X=Xd, y=Y, classes=np.array([10.0, 20.0, 30.0]))
    X, sets, _ = pio.read_input(tmp_path / "ml.npz", multilabel=True)
    assert sets[0] == (10.0, 30.0) and sets[-1] == (20.0,)
    np.savez(tmp_path / "noy.npz", X=Xd)
    with pytest.raises(InputError, match=r"noy\.npz: no 'y' array"):
        pio.read_input(tmp_path / "noy.npz")


def test_csv_inputs(tmp_path):
    p = write_text(tmp_path / "h.csv", """\
        label,a,b
        1,0.5,0
        -1,0,2.5
        """)
    X, y, qid = pio.read_input(p)
    assert isinstance(X, np.ndarray) and np.array_equal(X, [[0.5, 0], [0, 2.5]])
    assert list(y) == [1, -1] and qid is None
    p = write_text(tmp_path / "last.csv", "0.5,0,1\n0,2.5,-1\n")
    X, y, _ = pio.read_input(p, label_column=-1)
    assert np.array_equal(X, [[0.5, 0], [0, 2.5]]) and list(y) == [1, -1]
    pio.write_shards(X, y, tmp_path / "out", 2)
    L = pio.load_local(tmp_path / "out", SerialComm())
    assert isinstance(L.X, np.ndarray) and np.array_equal(L.X, X)


def test_csv_errors(tmp_path):
    p = write_text(tmp_path / "bad.csv", "1,0.5,0\nyes,0,2.5\n")
    with pytest.raises(InputError, match=r"bad\.csv: line 2: non-numeric label 'yes'"):
        pio.read_input(p)
    p = write_text(tmp_path / "nan.csv", "1,0.5,0\n2,inf,2.5\n")
    with pytest.raises(InputError, match=r"nan\.csv: row 2 has a non-finite feature value"):
        pio.read_input(p)
    p = write_text(tmp_path / "ragged.csv", "1,0.5,0\n2,1\n")
    with pytest.raises(InputError, match=r"ragged\.csv: line 2 has 2 columns, expected 3"):
        pio.read_input(p)


# --------------------------------------------------------------------------
# Input errors
# --------------------------------------------------------------------------

def test_malformed_svmlight_line(tmp_path):
    lines = "".join(f"1 1:{i} 2:1\n" for i in range(5000)) + "-1 2:x\n"
    p = write_text(tmp_path / "bad.txt", lines)
    with pytest.raises(InputError) as info:
        pio.read_input(p)
    assert str(info.value) == (f"{p}: malformed SVMlight input at line 5001: "
                               "could not convert string to float: b'x'")
    p = write_text(tmp_path / "unsorted.txt", "1 1:2 3:4\n-1 3:1 2:1\n")
    with pytest.raises(InputError, match=r"unsorted\.txt: malformed SVMlight input at line 2: "
                                         r"Feature indices .* should be sorted and unique"):
        pio.read_input(p)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_feature(tmp_path, value):
    p = write_text(tmp_path / "nf.txt", f"# header comment\n1 1:2\n\n-1 1:1 2:{value}\n")
    with pytest.raises(InputError) as info:
        pio.read_input(p)
    assert str(info.value) == f"{p}: row 2 (line 4) has a non-finite feature value"


def test_non_finite_label(tmp_path):
    p = write_text(tmp_path / "nl.txt", "1 1:2\nnan 2:1\n")
    with pytest.raises(InputError, match=r"nl\.txt: row 2 \(line 2\) has a non-finite label"):
        pio.read_input(p)


def test_non_numeric_label(tmp_path):
    p = write_text(tmp_path / "lab.txt", "1 1:2\nspam 2:1\n")
    with pytest.raises(InputError) as info:
        pio.read_input(p)
    assert str(info.value) == f"{p}: line 2: non-numeric label 'spam'"


def test_multilabel_without_flag(tmp_path):
    p = write_text(tmp_path / "ml.txt", "1,2 1:2\n3 2:1\n")
    with pytest.raises(InputError, match=r"ml\.txt: line 1: label '1,2' is a label set; "
                                         r"read multilabel data with --multilabel"):
        pio.read_input(p)
    X, y, _ = pio.read_input(p, multilabel=True)
    assert y == [(1.0, 2.0), (3.0,)]


@pytest.mark.parametrize("text", ["", "# only a comment\n\n"])
def test_empty_file(tmp_path, text):
    p = write_text(tmp_path / "empty.txt", text)
    with pytest.raises(InputError) as info:
        pio.read_input(p)
    assert str(info.value) == f"{p}: empty file (no data rows)"


def test_missing_input_and_partial_qid(tmp_path):
    with pytest.raises(InputError, match=r"nope\.txt: no such file"):
        pio.read_input(tmp_path / "nope.txt")
    p = write_text(tmp_path / "q.txt", "1 qid:1 1:2\n2 1:1\n")
    with pytest.raises(InputError, match=r"q\.txt: 1 of 2 rows have a query id"):
        pio.read_input(p)


def test_parts_more_than_rows(tmp_path):
    with pytest.raises(InputError, match="cannot split 3 rows into 4 parts"):
        pio.write_shards(np.ones((3, 2)), np.ones(3), tmp_path / "o", 4)
    assert not os.path.exists(tmp_path / "o")


def test_write_shards_non_finite(tmp_path):
    X = sp.csr_matrix(np.array([[1.0, 0], [0, np.inf]]))
    with pytest.raises(InputError, match="arr: row 2 has a non-finite feature value"):
        pio.write_shards(X, [1, 2], tmp_path / "o", 1, source="arr")


def test_refuse_to_overwrite_and_stale_removal(tmp_path):
    X, y = np.eye(6), np.arange(6.0)
    pio.write_shards(X, y, tmp_path, 4)
    with pytest.raises(InputError) as info:
        pio.write_shards(X, y, tmp_path, 2)
    assert str(info.value) == (f"{tmp_path}: already holds shard files (part-00000.h5, ...); "
                               "pass --overwrite (overwrite=True) to replace them")
    assert len(pio.list_shards(tmp_path)) == 4
    paths = pio.write_shards(X, y, tmp_path, 2, overwrite=True)
    assert pio.list_shards(tmp_path) == paths and len(paths) == 2
    assert sorted(os.listdir(tmp_path)) == ["part-00000.h5", "part-00001.h5"]
    assert np.array_equal(pio.load_local(tmp_path, SerialComm()).X, X)


def test_no_partial_output_on_write_failure(tmp_path, monkeypatch):
    real = shards._write_one
    calls = []

    def failing(path, *args):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(path, *args)

    monkeypatch.setattr(shards, "_write_one", failing)
    with pytest.raises(InputError, match="cannot write shard files: .*No space left"):
        pio.write_shards(np.eye(5), np.arange(5.0), tmp_path / "new", 4)
    assert not os.path.exists(tmp_path / "new")
    os.mkdir(tmp_path / "old")
    calls.clear()
    with pytest.raises(InputError):
        pio.write_shards(np.eye(5), np.arange(5.0), tmp_path / "old", 4)
    assert os.listdir(tmp_path / "old") == []


# --------------------------------------------------------------------------
# Loading errors
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(3)
    X = sp.random(60, 8, density=0.4, random_state=rng, format="csr")
    return X, rng.integers(1, 4, 60).astype(float)


def test_list_shards(small, tmp_path):
    X, y = small
    paths = pio.write_shards(X, y, tmp_path / "s", 3)
    assert pio.list_shards(tmp_path / "s") == paths
    assert pio.list_shards(str(tmp_path / "s" / "part-*.h5")) == paths
    assert pio.list_shards(paths[1]) == [paths[1]]
    assert pio.list_shards(paths[::-1]) == paths[::-1]
    os.mkdir(tmp_path / "empty")
    with pytest.raises(InputError) as info:
        pio.list_shards(tmp_path / "empty")
    assert str(info.value) == f"{tmp_path / 'empty'}: no shard files (part-*.h5)"
    with pytest.raises(InputError, match="no shard files match this pattern"):
        pio.list_shards(str(tmp_path / "x*" / "part-*.h5"))


def test_missing_shard_file(small, tmp_path):
    X, y = small
    pio.write_shards(X, y, tmp_path, 4)
    os.remove(tmp_path / "part-00002.h5")
    with pytest.raises(CollectiveError) as info:
        pio.load_local(tmp_path, SerialComm())
    assert str(info.value) == (f"{tmp_path}: missing shard part-00002.h5 "
                               "(shard_count is 4, found 3 files)")


def test_rows_do_not_add_up(small, tmp_path):
    X, y = small
    paths = pio.write_shards(X, y, tmp_path, 2)
    with h5py.File(paths[1], "a") as f:
        f.attrs["n_examples_total"] = 61
    with pytest.raises(PrbmrmError, match="shards disagree on n_examples_total"):
        pio.load_local(tmp_path, SerialComm())
    with h5py.File(paths[0], "a") as f:
        f.attrs["n_examples_total"] = 61
    with pytest.raises(PrbmrmError, match="the 2 shard files hold 60 rows but "
                                          "n_examples_total is 61"):
        pio.load_local(tmp_path, SerialComm())


def test_truncated_shard(dna, tmp_path):
    X, y, _ = dna
    paths = pio.write_shards(X, y, tmp_path, 3)
    os.truncate(paths[1], os.path.getsize(paths[1]) // 2)
    with pytest.raises(CollectiveError) as info:
        pio.load_local(tmp_path, SerialComm())
    message = str(info.value)
    assert message.startswith(f"{paths[1]}: not a readable HDF5 file (truncated or corrupt): ")
    assert "\n" not in message


def test_not_a_shard_file(small, tmp_path):
    X, y = small
    paths = pio.write_shards(X, y, tmp_path, 2)
    with h5py.File(paths[0], "a") as f:
        f.attrs["format_version"] = 2
    with pytest.raises(CollectiveError, match=r"part-00000\.h5: shard format version 2 is "
                                              r"not supported"):
        pio.load_local(tmp_path, SerialComm())
    with open(paths[0], "wb") as f:
        f.write(b"this is not HDF5 at all" * 10)
    with pytest.raises(CollectiveError, match=r"part-00000\.h5: not a readable HDF5 file"):
        pio.load_local(tmp_path, SerialComm())


@pytest.mark.parametrize("dense", [False, True])
def test_shard_with_bad_index(small, tmp_path, dense):
    X, y = small
    paths = pio.write_shards(X, y, tmp_path, 2)
    with h5py.File(paths[1], "a") as f:
        idx = f["X/indices"][()]
        idx[0] = 8
        f["X/indices"][...] = idx
    with pytest.raises(CollectiveError, match=r"part-00001\.h5: /X/indices has a feature "
                                              r"index out of range \[0, 8\)"):
        pio.load_local(tmp_path, SerialComm(), dense=dense)


def test_shards_with_different_feature_counts(small, tmp_path):
    X, y = small
    pio.write_shards(X, y, tmp_path / "set1", 2)
    pio.write_shards(X[:, :5], y, tmp_path / "set2", 2)
    os.remove(tmp_path / "set1" / "part-00001.h5")
    os.remove(tmp_path / "set2" / "part-00000.h5")
    with pytest.raises(CollectiveError) as info:
        pio.load_local(str(tmp_path / "set*" / "part-*.h5"), SerialComm())
    assert str(info.value) == (
        "shards disagree on the number of features: "
        f"{tmp_path / 'set1' / 'part-00000.h5'} has 8, "
        f"{tmp_path / 'set2' / 'part-00001.h5'} has 5")


def test_shards_with_different_classes(small, tmp_path):
    X, y = small
    pio.write_shards(X, y, tmp_path / "a", 2)
    pio.write_shards(X, np.where(y == 3, 4.0, y), tmp_path / "b", 2)
    with pytest.raises(CollectiveError, match=r"shards disagree on the label classes: "
                                              r".*a/part-00000\.h5 has \[1, 2, 3\], "
                                              r".*b/part-00001\.h5 has \[1, 2, 4\]"):
        pio.load_local([tmp_path / "a" / "part-00000.h5", tmp_path / "b" / "part-00001.h5"],
                        SerialComm())


def test_fewer_shard_files_than_ranks(small, tmp_path):
    """Ranks read row ranges: 2 files serve 3 ranks; only fewer rows (or whole queries) than ranks fail."""
    X, y = small
    pio.write_shards(X, y, tmp_path / "two", 2)
    local = pio.load_local(tmp_path / "two", FakeComm(rank=0, size=3))
    n = local.n_local  # a third of the canonical blocks, which cut the first file's rows evenly
    assert 15 <= n <= 25 and local.row_offset == 0 and local.files == [str(tmp_path / "two" / "part-00000.h5")]
    assert same_matrix(local.X, X[:n]) and np.array_equal(local.y, y[:n])
    pio.write_shards(X[:2], y[:2], tmp_path / "tiny", 1)
    with pytest.raises(CollectiveError) as info:
        pio.load_local(tmp_path / "tiny", FakeComm(rank=0, size=3))
    assert str(info.value) == f"{tmp_path / 'tiny'}: 2 rows for 3 ranks: need at least one row per rank"


# --------------------------------------------------------------------------
# split_local: in-memory data on every rank
# --------------------------------------------------------------------------

def test_split_local_blocks(mq2008):
    X, y, qid = mq2008
    blocks = [pio.split_local(X, y, FakeComm(r, 3), qid=qid, bias=True, dense=False) for r in range(3)]
    assert [b.row_offset for b in blocks] == [0, blocks[0].n_local,
                                              blocks[0].n_local + blocks[1].n_local]
    assert same_matrix(sp.vstack([b.X[:, :46] for b in blocks]), X)
    assert np.array_equal(np.concatenate([b.y for b in blocks]), y)
    seen = [set(b.qid) for b in blocks]
    assert not (seen[0] & seen[1] or seen[1] & seen[2] or seen[0] & seen[2])
    for b in blocks:
        assert b.X.indices.dtype == np.int32 and b.X.indptr.dtype == np.int32
        assert b.label_kind == "integer" and list(b.classes) == [0.0, 1.0, 2.0]
        assert b.n_examples_total == 1000 and b.files == [] and b.n_features == 46


def test_blocks_are_the_same_on_any_number_of_ranks(dna, tmp_path):
    X, y, _ = dna
    paths = pio.write_shards(X, y, tmp_path, 5)
    L = pio.load_local(tmp_path, SerialComm())
    # Shards are cut into canonical blocks that refine the files: one per 2**13 values (nonzeros + rows), at
    # least 64 and at most 256 over the set (here 64: 13 per file, 64 / 5 rounded up), whatever the number of
    # ranks up to that (tests/distributed/test_any_ranks.py).
    assert (X.nnz + X.shape[0]) // 2**13 < 64
    assert set(np.r_[0, np.cumsum(shard_rows(paths))].tolist()) <= set(L.blocks) and len(L.blocks) == 5 * 13 + 1

    def global_blocks(size):
        out = set()
        for r in range(size):
            b = pio.split_local(X, y, FakeComm(r, size))
            assert b.blocks[0] == 0 and b.blocks[-1] == b.n_local
            out |= {b.row_offset + k for k in b.blocks}
        return sorted(out)

    one = global_blocks(1)
    # One block per 2**14 values (nonzeros + rows), at least 8, at most 64.
    K = min(64, max(8, (X.nnz + X.shape[0]) // 2**14))
    assert len(one) == K + 1 and one[0] == 0 and one[-1] == 2000
    assert all(global_blocks(P) == one for P in range(2, K + 1))


@pytest.mark.parametrize("rows, d, blocks", [(8000, 100, 98), (30000, 100, 256)])
def test_larger_shard_sets_get_more_blocks(tmp_path, rows, d, blocks):
    # (rows x features + rows) // 2**13 blocks between 64 and 256: 8000 x 100 dense values make 98 (in 3 files,
    # 33 each: 99), and 3M make the most, 256 (86 a file: 258).
    X = np.random.default_rng(0).standard_normal((rows, d))
    pio.write_shards(X, np.sign(X[:, 0]) + (X[:, 0] == 0), tmp_path, 3)
    assert (rows * d + rows) // 2**13 == blocks or blocks == 256
    L = pio.load_local(tmp_path, SerialComm())
    assert len(L.blocks) - 1 == 3 * -(-blocks // 3)


def test_split_local_errors_and_overrides():
    X = np.ones((2, 3))
    with pytest.raises(CollectiveError, match="demo: cannot split 2 rows into 3 ranks"):
        pio.split_local(X, [1.0, 2.0], FakeComm(0, 3), source="demo")
    X[1, 2] = np.nan
    with pytest.raises(CollectiveError, match="demo: row 2 has a non-finite feature value"):
        pio.split_local(X, [1.0, 2.0], SerialComm(), source="demo")
    L = pio.split_local(np.eye(3), [1.0, 2.0, 3.0], SerialComm(), label_kind="real")
    assert L.label_kind == "real" and L.classes is None
    L = pio.split_local(np.eye(3), np.array([[1, 0], [0, 1], [1, 1]]), SerialComm())
    assert L.label_kind == "multilabel" and L.y.dtype == np.int8 and L.y.shape == (3, 2)


# --------------------------------------------------------------------------
# The command line: python -m prbmrm.cli.shard
# --------------------------------------------------------------------------

def clean_env():
    """The environment without the MPI launcher's variables (the suite may run under mpiexec)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "MPI_", "HYDRA_", "OMPI_"))}
    env["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    return env


def run_cli(*args):
    env = clean_env()
    return subprocess.run([sys.executable, "-m", "prbmrm.cli.shard", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)


def test_cli_success(tmp_path):
    out = tmp_path / "mq"
    r = run_cli(shared("mq2008_subset_vali.txt.xz"), "--parts", 3, "--out", out)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert len(lines) == 4 and lines[0].startswith("part-00000.h5: ")
    assert "queries" in lines[0] and lines[-1].startswith("total: 3 sparse shards")
    assert "1,000 rows" in lines[-1] and "69 queries" in lines[-1]
    assert sorted(os.listdir(out)) == [f"part-0000{i}.h5" for i in range(3)]
    r = run_cli(shared("dna.scale.xz"), "-p", 2, "-o", tmp_path / "dna", "--positive", 3,
                "--dense", "--quiet")
    assert r.returncode == 0 and r.stdout == ""
    L = pio.load_local(tmp_path / "dna", SerialComm())
    assert isinstance(L.X, np.ndarray) and L.label_kind == "binary"


@pytest.mark.parametrize("case", ["malformed", "parts", "usage", "overwrite"])
def test_cli_errors(tmp_path, case):
    out = tmp_path / "out"
    good = write_text(tmp_path / "good.txt", "1 1:1\n-1 2:1\n1 1:3\n")
    if case == "malformed":
        bad = write_text(tmp_path / "bad.txt", "1 1:1\n-1 2:1 1:1\n")
        r = run_cli(good, bad, "--parts", 2, "--out", out)
        expected = "bad.txt: malformed SVMlight input at line 2"
    elif case == "parts":
        r = run_cli(good, "--parts", 4, "--out", out)
        expected = "cannot split 3 rows into 4 parts"
    elif case == "usage":
        r = run_cli(good, "--parts", "many", "--out", out)
        expected = "argument --parts/-p: invalid int value: 'many'"
    else:
        assert run_cli(good, "-p", 2, "-o", out).returncode == 0
        r = run_cli(good, "-p", 3, "-o", out)
        expected = "already holds shard files"
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("prbmrm.cli.shard: error: ")
    assert expected in lines[0] and "Traceback" not in r.stderr
    if case == "overwrite":
        assert sorted(os.listdir(out)) == ["part-00000.h5", "part-00001.h5"]
    else:
        assert not os.path.exists(out) or not os.listdir(out)


def test_cli_main_in_process(tmp_path, capsys, monkeypatch):
    from prbmrm.cli import shard

    monkeypatch.delenv("PMI_SIZE", raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    p = write_text(tmp_path / "in.txt", "1 1:1\n-1 2:1\n")
    assert shard.main([p, "-p", "2", "-o", str(tmp_path / "o"), "-q"]) == 0
    assert shard.main([p, "-p", "0", "-o", str(tmp_path / "o2")]) == 2
    assert "prbmrm.cli.shard: error: --parts must be at least 1" in capsys.readouterr().err


def test_cli_never_initialises_mpi(tmp_path):
    p = write_text(tmp_path / "in.txt", "1 1:1\n-1 2:1\n")
    code = ("import sys; from prbmrm.cli import shard; "
            f"status = shard.main([{p!r}, '-p', '2', '-o', {str(tmp_path / 'o')!r}, '-q']); "
            "print(status, 'mpi4py.MPI' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env(), timeout=60, stdin=subprocess.DEVNULL)
    assert r.stdout.split() == ["0", "False"], r.stderr


def test_cli_refuses_several_ranks(tmp_path, monkeypatch, capsys):
    from prbmrm.cli import shard

    p = write_text(tmp_path / "in.txt", "1 1:1\n-1 2:1\n")
    monkeypatch.setenv("PMI_SIZE", "3")
    assert shard.main([p, "-p", "2", "-o", str(tmp_path / "o")]) == 2
    assert "runs on one process" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")


# --------------------------------------------------------------------------
# Under MPI: every rank reads its own block; errors are the same everywhere
# --------------------------------------------------------------------------

MPI_SCRIPT = textwrap.dedent("""
    import json
    import sys
    import numpy as np
    from prbmrm import io as pio
    from prbmrm.distributed.comm import get_comm
    from prbmrm.errors import CollectiveError

    comm = get_comm()
    d = sys.argv[1]
    L = pio.load_local(d + "/ok", comm, bias=True)
    f = L.X[:, :-1] @ np.arange(1.0, L.n_features + 1)
    full = comm.gather_scalars(f)
    qids = comm.gather_scalars(L.qid.astype(float))
    if comm.rank == 0:
        np.save(d + "/f.npy", full)
        np.save(d + "/q.npy", qids)
    out = dict(files=len(L.files), rows=L.n_local, offset=L.row_offset, errors=[])
    for spec in ("/miss", "/mix*/part-*.h5", "/cls*/part-*.h5"):
        try:
            pio.load_local(d + spec, comm)
        except CollectiveError as e:
            out["errors"].append(str(e))
    with open(f"{d}/rank{comm.rank}.json", "w") as fh:
        json.dump(out, fh)
""")


def test_load_local_under_mpi(mq2008, tmp_path):
    import json

    X, y, qid = mq2008
    pio.write_shards(X, y, tmp_path / "ok", 5, qid=qid)
    pio.write_shards(X, y, tmp_path / "miss", 4, qid=qid)
    os.remove(tmp_path / "miss" / "part-00003.h5")
    pio.write_shards(X, y, tmp_path / "mix1", 3, qid=qid)
    pio.write_shards(X[:, :40], y, tmp_path / "mix2", 3, qid=qid)
    os.remove(tmp_path / "mix1" / "part-00001.h5")
    os.remove(tmp_path / "mix1" / "part-00002.h5")
    os.remove(tmp_path / "mix2" / "part-00000.h5")
    pio.write_shards(X, y, tmp_path / "cls1", 3, qid=qid)
    pio.write_shards(X, np.where(y == 2, 4.0, y), tmp_path / "cls2", 3, qid=qid)
    os.remove(tmp_path / "cls1" / "part-00001.h5")
    os.remove(tmp_path / "cls1" / "part-00002.h5")
    os.remove(tmp_path / "cls2" / "part-00000.h5")
    script = tmp_path / "run.py"
    script.write_text(MPI_SCRIPT)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([mpiexec(), "-n", "3", sys.executable, str(script), str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(3)]
    assert [o["files"] for o in ranks] == [1, 2, 2]  # files[r*5//3:(r+1)*5//3]
    assert [o["offset"] for o in ranks] == [0, ranks[0]["rows"],
                                           ranks[0]["rows"] + ranks[1]["rows"]]
    f = np.load(tmp_path / "f.npy")
    np.testing.assert_allclose(f, X @ np.arange(1.0, 47), rtol=1e-13)
    np.testing.assert_array_equal(np.load(tmp_path / "q.npy"), qid)
    missing = f"{tmp_path / 'miss'}: missing shard part-00003.h5 (shard_count is 4, found 3 files)"
    mixed = (f"shards disagree on the number of features: "
             f"{tmp_path / 'mix1' / 'part-00000.h5'} has 46, "
             f"{tmp_path / 'mix2' / 'part-00001.h5'} has 40")
    classes = (f"shards disagree on the label classes: "
               f"{tmp_path / 'cls1' / 'part-00000.h5'} has [0, 1, 2], "
               f"{tmp_path / 'cls2' / 'part-00001.h5'} has [0, 1, 4]")
    for o in ranks:  # the same message on every rank, no hang
        assert o["errors"] == [missing, mixed, classes]


# ---- any number of ranks on any shard set: row ranges of canonical blocks, bitwise equal ----

@pytest.mark.distributed
@pytest.mark.parametrize("parts", [1, 2])
def test_fewer_shard_files_than_ranks_train_bitwise_equal(comm, mpi_tmp_path, parts):
    """1 or 2 shard files on any number of ranks: each rank reads row ranges; BMRM equals 1 rank's bitwise."""
    from helpers import load_svmlight, shared_shards
    from prbmrm.losses import get_loss
    from prbmrm.distributed.oracle import DistributedRisk, run_distributed
    from prbmrm.solvers import minimize

    X, y = load_svmlight("a9a.xz")
    X, y = X[:4000], y[:4000]
    directory = shared_shards(comm, mpi_tmp_path, X, y, parts=parts)
    local = pio.load_local(directory, comm, bias=True)
    # Every row is held by exactly one rank, in order.
    gathered = comm.gather_scalars(local.y)
    if comm.is_root:
        np.testing.assert_array_equal(gathered, y)

    def run(local, comm):
        oracle = DistributedRisk(get_loss("hinge"), local.X, local.y, local.n_examples_total, comm, local.blocks)
        return run_distributed(oracle, lambda risk: minimize(risk, np.zeros(oracle.dim), 1e-3, max_iter=60))

    result = run(local, comm)
    if comm.is_root:
        expected = run(pio.load_local(directory, SerialComm(), bias=True), SerialComm())
        assert result.nit == expected.nit
        np.testing.assert_array_equal(result.w, expected.w)
        np.testing.assert_array_equal(result.history["lower_bound"], expected.history["lower_bound"])
