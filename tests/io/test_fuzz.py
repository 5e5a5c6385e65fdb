"""Every reader fuzzed: any input gives a correct result or one clean error naming the file, never a traceback.

Property-based fuzzing (hypothesis, derandomized: the same inputs on every run, a fixed budget per
reader) of the SVMlight, CSV and npz readers, the shard, model and checkpoint files (HDF5 files
crafted with h5py: attributes and datasets of every type and shape, datasets that declare more
than they store), the configuration file (TOML) and the party messages (control messages, roster
and key files). A reader passes an input if it returns a result that satisfies the reader's
properties (for well-formed text, the values of an independent parse) or raises a
:class:`prbmrm.errors.PrbmrmError` whose message is one line naming the file; anything else
(another exception, a message without the file, an allocation of what the file merely declares)
fails. :data:`BUDGET` is the number of inputs per reader: over 10,000 in all.
"""

import gzip
import io
import json
import os
import shutil

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prbmrm.checkpoint import TAG, load_checkpoint, save_checkpoint
from prbmrm.cli.config import config_layout, read_config
from prbmrm.cli.train import build_parser
from prbmrm.distributed.comm import SerialComm
from prbmrm.distributed.messages import decode, encode, expect_array
from prbmrm.errors import PrbmrmError
from prbmrm.io import load_local, read_input, write_shards
from prbmrm.model import load_model, save_model
from prbmrm.party.keys import load_roster, load_signing_key

BUDGET = {"svmlight": 2000, "csv": 1200, "npz": 1000, "shard": 1500, "model": 1000, "checkpoint": 900,
          "config": 1200, "message": 1500, "roster": 300}
"""Inputs per reader (11,600 in all)."""

SCALE = float(os.environ.get("PRBMRM_FUZZ_SCALE", "1"))
"""A longer or shorter campaign by hand (``PRBMRM_FUZZ_SCALE=10``); the suite runs :data:`BUDGET` as is."""

RUN = {}
"""Inputs each reader was given in this session (see :func:`fuzz`)."""


def fuzz(reader):
    """The hypothesis settings of `reader`'s fuzz test: derandomized, no deadline, its budget of inputs."""
    return settings(max_examples=max(1, int(BUDGET[reader] * SCALE)), derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=False)


def count(reader):
    RUN[reader] = RUN.get(reader, 0) + 1


def clean(error, path):
    """Whether `error` is a clean error about `path`: a PrbmrmError, one line, naming the file and more."""
    message = str(error)
    assert isinstance(error, PrbmrmError), f"{type(error).__name__}: {message}"
    assert "\n" not in message, message
    assert str(path) in message and len(message) > len(str(path)) + 5, message


def outcome(path, read, *args, **kwargs):
    """``read(*args)``'s result, or None after checking that the error it raised is clean."""
    try:
        return read(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 -- the property under test: only clean errors
        clean(error, path)
        return None


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


# ---- text: SVMlight and CSV --------------------------------------------------------------

NOISE = [b"0", b"1", b"9", b"-", b"+", b".", b"e", b":", b" ", b"\t", b"\n", b"#", b",", b"qid", b"nan",
         b"inf", b"2147483648", b"99999999999999999999999", b"1e400", b"\x00", b"\xff", b"\xc3", b"\r"]


@st.composite
def mutated(draw, valid):
    """The bytes of a valid input `valid` with a few edits: replaced, inserted or deleted pieces."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(data)))
        piece = draw(st.sampled_from(NOISE) | st.binary(max_size=3))
        action = draw(st.sampled_from(("insert", "replace", "delete", "truncate")))
        if action == "insert":
            data[at:at] = piece
        elif action == "replace":
            data[at:at + len(piece)] = piece
        elif action == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        else:
            del data[at:]
    return bytes(data)


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32).map(float)


@st.composite
def svmlight_rows(draw):
    """Rows (label, {index: value}, qid or None) with one-based sorted indices."""
    with_qid = draw(st.booleans())
    rows = []
    for _ in range(draw(st.integers(1, 8))):
        indices = draw(st.lists(st.integers(1, 40), unique=True, max_size=6))
        rows.append((draw(st.integers(-3, 3)), {i: draw(finite) for i in sorted(indices)},
                     draw(st.integers(0, 5)) if with_qid else None))
    return rows


def svmlight_text(rows):
    lines = []
    for label, features, qid in rows:
        fields = [str(label)] + ([f"qid:{qid}"] if qid is not None else [])
        fields += [f"{i}:{v!r}" for i, v in features.items()]
        lines.append(" ".join(fields))
    return ("\n".join(lines) + "\n").encode()


@fuzz("svmlight")
@given(rows=svmlight_rows(), edit=st.booleans(), data=st.data(), compress=st.booleans())
def test_svmlight(work, rows, edit, data, compress):
    count("svmlight")
    text = svmlight_text(rows)
    if edit:
        text = data.draw(mutated(st.just(text)))
    path = work / ("input.svm.gz" if compress else "input.svm")
    raw = gzip.compress(text, mtime=0) if compress else text
    if compress and edit and data.draw(st.booleans()):
        raw = data.draw(mutated(st.just(raw)))  # the compressed stream itself damaged
    path.write_bytes(raw)
    result = outcome(path, read_input, str(path))
    if result is None:  # a file without any feature value is refused too
        assert edit or not any(features for _, features, _ in rows), "a well-formed file was refused"
        return
    X, y, qid = result
    assert sp.issparse(X) and X.shape[0] == len(y) and np.isfinite(X.data).all() and np.isfinite(y).all()
    assert qid is None or qid.shape == y.shape
    if not edit:  # an independent parse: one-based indices, the width the largest index
        width = max([i for _, features, _ in rows for i in features] + [0])
        expected = np.zeros((len(rows), width))
        for r, (_, features, _) in enumerate(rows):
            for i, v in features.items():
                expected[r, i - 1] = v
        if width:
            np.testing.assert_array_equal(X.toarray(), expected)
        np.testing.assert_array_equal(y, [label for label, _, _ in rows])
        if rows[0][2] is not None:
            np.testing.assert_array_equal(qid, [q for _, _, q in rows])


@st.composite
def csv_tables(draw):
    rows, columns = draw(st.integers(1, 6)), draw(st.integers(2, 5))
    values = [[draw(finite) for _ in range(columns)] for _ in range(rows)]
    header = [f"c{j}" for j in range(columns)] if draw(st.booleans()) else None
    return header, values


def csv_text(header, values):
    lines = ([",".join(header)] if header else []) + [",".join(repr(v) for v in row) for row in values]
    return ("\n".join(lines) + "\n").encode()


@fuzz("csv")
@given(table=csv_tables(), edit=st.booleans(), data=st.data())
def test_csv(work, table, edit, data):
    count("csv")
    header, values = table
    text = csv_text(header, values)
    if edit:
        text = data.draw(mutated(st.just(text)))
    path = work / "input.csv"
    path.write_bytes(text)
    result = outcome(path, read_input, str(path))
    if result is None:
        assert edit, "a well-formed file was refused"
        return
    X, y, _ = result
    assert X.shape[0] == len(y) and np.isfinite(X).all() and np.isfinite(y).all()
    if not edit:
        A = np.array(values)
        np.testing.assert_array_equal(y, A[:, 0])
        np.testing.assert_array_equal(X, A[:, 1:])


# ---- npz -------------------------------------------------------------------------------------

def small_arrays():
    dtypes = st.sampled_from(["f8", "f4", "f2", "i8", "i4", "u1", "b1", "c16", "U3", "S2", "M8[s]"])
    shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)
    return st.builds(lambda dtype, shape, seed: _array(dtype, shape, seed), dtypes, shapes, st.integers(0, 3))


def _array(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(-2, 5, size=shape)
    if dtype in ("U3", "S2"):
        return values.astype(dtype)
    if dtype == "M8[s]":
        return values.astype("M8[s]")
    if dtype.startswith("f") and seed == 3 and values.size:
        values = values.astype(float)
        values.flat[0] = np.nan
    return np.asarray(values).astype(dtype)


@fuzz("npz")
@given(arrays=st.dictionaries(st.sampled_from(["X", "y", "qid", "data", "indices", "indptr", "shape", "format",
                                               "classes"]), small_arrays(), max_size=6),
       base=st.booleans(), damage=st.booleans(), data=st.data())
def test_npz(work, arrays, base, damage, data):
    count("npz")
    if base:  # a valid sparse input, some arrays then replaced
        X = sp.random(4, 3, density=0.5, random_state=0, format="csr")
        arrays = dict(dict(data=X.data, indices=X.indices, indptr=X.indptr, shape=np.array(X.shape),
                           y=np.array([1.0, -1.0, 1.0, -1.0])), **arrays)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # object arrays are pickled here: the reader must refuse them
    raw = buffer.getvalue()
    if damage:
        raw = data.draw(mutated(st.just(raw)))
    path = work / "input.npz"
    path.write_bytes(raw)
    result = outcome(path, read_input, str(path))
    if result is not None:
        X, y, qid = result
        assert X.shape[0] == len(y)
        assert np.isfinite(X.data if sp.issparse(X) else X).all()


# ---- HDF5: shards, models, checkpoints ------------------------------------------------------

ODD_VALUES = [0, -1, 1, 2, 3, 2**31, 2**40, 2**63 - 1, 0.5, 2.0, float("nan"), float("inf"), -1e300, "text",
              b"bytes", "", True, np.array([1, 2]), np.array([]), np.array([[1.5]]), np.array(["a", "b"]),
              np.int8(3), np.uint64(2**64 - 1), np.float32(1.5), "binary", "real", "multilabel",
              "multioutput", "integer", "prbmrm-shard", "prbmrm-model", "prbmrm-checkpoint", "{}", "[1, 2]",
              '{"a": 1}', "null", "[" * 50]


def odd_dataset(draw):
    """(dtype, shape, how) of a replacement dataset: written, or declared and not stored."""
    dtype = draw(st.sampled_from(["f8", "f4", "i8", "i4", "u1", "i1", "b1", "S3", "c16"]))
    shape = draw(st.sampled_from([(), (0,), (1,), (3,), (4,), (5,), (2, 3), (4, 1), (2**40,), (3, 2**40)]))
    return dtype, shape, draw(st.sampled_from(["values", "declared", "nan", "huge"]))


def put_dataset(group, name, spec):
    dtype, shape, how = spec
    if name in group:
        del group[name]
    big = int(np.prod(shape, dtype=object)) > 10**6
    if how == "declared" or big:
        group.create_dataset(name, shape=shape, dtype="f8" if dtype in ("S3",) else dtype)
        return
    values = np.arange(int(np.prod(shape, dtype=object))).reshape(shape)
    if how == "nan" and dtype.startswith("f") and values.size:
        values = values.astype(float)
        values.flat[-1] = np.nan
    if how == "huge" and dtype in ("i8", "f8") and values.size:
        values = values.astype(dtype)
        values.flat[0] = 2**62 if dtype == "i8" else 1e300
    group.create_dataset(name, data=np.asarray(values).astype(dtype))


@st.composite
def hdf5_edits(draw, attributes, datasets):
    """A list of edits of an HDF5 file: attributes set or deleted, datasets replaced, links added."""
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["attribute", "attribute", "delete", "dataset", "dataset", "link"]))
        if kind in ("attribute", "delete"):
            edits.append((kind, draw(st.sampled_from(attributes)), draw(st.sampled_from(ODD_VALUES))))
        elif kind == "dataset":
            edits.append((kind, draw(st.sampled_from(datasets)), odd_dataset(draw)))
        else:
            edits.append((kind, draw(st.sampled_from(datasets)), draw(st.sampled_from(["soft", "external"]))))
    return edits


def apply_edits(path, edits):
    with h5py.File(path, "r+") as f:
        for kind, name, value in edits:
            owner, _, key = name.rpartition("@") if "@" in name else ("/", "", name)
            if kind == "attribute":
                f[owner or "/"].attrs[key] = value
            elif kind == "delete":
                if "@" in name or name in f.attrs:
                    f[owner or "/"].attrs.pop(key, None)
                elif name in f:
                    del f[name]
            elif kind == "dataset":
                parent, _, leaf = name.rpartition("/")
                group = f.require_group(parent) if parent else f
                put_dataset(group, leaf, value)
            else:
                if name in f:
                    del f[name]
                f[name] = (h5py.SoftLink("/nowhere") if value == "soft"
                           else h5py.ExternalLink("/etc/passwd", "/x"))


SHARD_ATTRIBUTES = ["format", "format_version", "n_features", "n_examples", "n_examples_total", "shard_index",
                    "shard_count", "label_kind", "classes", "positive", "negative", "exact_width",
                    "X@shape", "X@encoding-type"]
SHARD_DATASETS = ["X/data", "X/indices", "X/indptr", "y", "qid"]


@pytest.fixture(scope="module")
def shard_base(work):
    X = sp.random(5, 4, density=0.6, random_state=2, format="csr")
    write_shards(X, np.array([1.0, -1.0, 1.0, 1.0, -1.0]), work / "shard-base", 1)
    dense = np.arange(15, dtype=float).reshape(5, 3)
    write_shards(dense, np.array([0.0, 1.0, 2.0, 1.0, 0.0]), work / "shard-dense", 1, dense=True)
    return [work / "shard-base" / "part-00000.h5", work / "shard-dense" / "part-00000.h5"]


@fuzz("shard")
@given(base=st.integers(0, 1), edits=hdf5_edits(SHARD_ATTRIBUTES, SHARD_DATASETS + ["X"]),
       truncate=st.one_of(st.none(), st.integers(0, 4000)))
def test_shard(work, shard_base, base, edits, truncate):
    count("shard")
    directory = work / "shard"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    path = directory / "part-00000.h5"
    shutil.copy(shard_base[base], path)
    try:
        apply_edits(path, edits)
    except (TypeError, ValueError, OSError, KeyError, RuntimeError):
        return  # h5py cannot write this edit: nothing to read
    if truncate is not None:
        with open(path, "r+b") as f:
            f.truncate(truncate)
    local = outcome(directory, load_local, str(directory), SerialComm())  # the file, or the set it is in
    if local is not None:
        X, y = local.X, local.y
        n = X.shape[0]
        assert X.shape[1] == local.n_features and len(y) == n == local.n_examples_total
        assert np.isfinite(X.data if sp.issparse(X) else X).all() and np.isfinite(np.asarray(y, float)).all()


MODEL_ATTRIBUTES = ["format", "bias", "loss", "loss_params", "label_kind", "classes", "positive", "negative",
                    "lam", "n_features"]


@pytest.fixture(scope="module")
def model_base(work):
    path = work / "model-base.h5"
    save_model(str(path), np.array([0.5, -1.0, 2.0]), 0.25,
               {"loss": "hinge", "loss_params": "{}", "label_kind": "binary", "classes": np.array([-1.0, 1.0]),
                "lam": 0.01}, {"iteration": np.arange(1, 4), "gap": np.array([1.0, 0.1, 0.0])})
    return path


@fuzz("model")
@given(edits=hdf5_edits(MODEL_ATTRIBUTES, ["w", "history/gap", "history/iteration", "path/lam"]))
def test_model(work, model_base, edits):
    count("model")
    path = work / "model.h5"
    shutil.copy(model_base, path)
    try:
        apply_edits(path, edits)
    except (TypeError, ValueError, OSError, KeyError, RuntimeError):
        return
    model = outcome(path, load_model, str(path))
    if model is not None:
        assert model.w.dtype.kind == "f" and np.isfinite(model.w).all()
        X = np.ones((2, model.w.shape[0]))
        assert np.isfinite(model.decision_function(X)).all()


CHECKPOINT_KEY = b"0123456789abcdef0123456789abcdef"
CHECKPOINT_ATTRIBUTES = ["format", "version", "options", "fingerprint", "iteration", TAG, "state@x"]
CHECKPOINT_DATASETS = ["state/w", "state/best_w", "state/iteration", "state/history/gap", "state/bundle/A",
                       "extra"]


@pytest.fixture(scope="module")
def checkpoint_base(work):
    path = work / "checkpoint-base.h5"
    state = {"w": np.array([1.0, 2.0]), "best_w": np.array([1.0, 2.0]), "iteration": 2,
             "history": {"gap": np.array([1.0, 0.5])}, "bundle": {"A": np.eye(2)}}
    save_checkpoint(str(path), state, {"options": {"lam": 0.1}, "fingerprint": {"rows": 3}, "iteration": 2},
                    CHECKPOINT_KEY)
    return path, load_checkpoint(str(path), CHECKPOINT_KEY)


@fuzz("checkpoint")
@given(edits=hdf5_edits(CHECKPOINT_ATTRIBUTES, CHECKPOINT_DATASETS))
def test_checkpoint(work, checkpoint_base, edits):
    count("checkpoint")
    path = work / "checkpoint.h5"
    base, (original, meta) = checkpoint_base
    shutil.copy(base, path)
    try:
        apply_edits(path, edits)
    except (TypeError, ValueError, OSError, KeyError, RuntimeError):
        return
    outcome(path, load_checkpoint, str(path))  # without the key: a state, or a clean error
    authenticated = outcome(path, load_checkpoint, str(path), CHECKPOINT_KEY)
    if authenticated is not None:  # accepted with the key: the edits changed nothing the tag covers
        state, edited_meta = authenticated
        assert edited_meta == meta
        assert json.dumps(state, default=lambda a: a.tolist()) == json.dumps(original, default=lambda a: a.tolist())


# ---- the configuration file ------------------------------------------------------------------

TOML_VALUES = st.one_of(
    st.integers(-2**63, 2**63 - 1).map(str), finite.map(repr), st.sampled_from(["nan", "inf", "-inf", "1e999"]),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.text(max_size=8).map(json.dumps),
    st.sampled_from(["1979-05-27", "07:32:00", "1979-05-27T07:32:00Z", "[1, 2]", '["a", "b"]', "[]", "{}",
                     "{ a = 1 }", '"0,2"', '"site-{rank}/"', '"2GB"', '"hinge"', '"bmrm"', "[[1]]"]))


PARSER = build_parser()
LAYOUT = config_layout(PARSER)


@st.composite
def toml_files(draw):
    layout = LAYOUT
    keys = st.sampled_from(sorted(layout[""]) + ["nonsense", "data", "dp-epsilon", "lam"])
    lines = [f"{draw(keys)} = {draw(TOML_VALUES)}" for _ in range(draw(st.integers(0, 4)))]
    for table in draw(st.lists(st.sampled_from(sorted(t for t in layout if t) + ["other"]), max_size=2)):
        lines.append(f"[{table}]")
        inner = st.sampled_from(sorted(layout.get(table, {"x": None})) + ["nonsense"])
        lines += [f"{draw(inner)} = {draw(TOML_VALUES)}" for _ in range(draw(st.integers(0, 3)))]
    return ("\n".join(lines) + "\n").encode()


@fuzz("config")
@given(text=toml_files(), edit=st.booleans(), data=st.data())
def test_config(work, text, edit, data):
    count("config")
    if edit:
        text = data.draw(mutated(st.just(text)))
    path = work / "run.toml"
    path.write_bytes(text)
    values = outcome(path, read_config, PARSER, str(path), SerialComm())
    assert values is None or isinstance(values, dict)


# ---- party messages, rosters and keys ------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["__array__", "__bytes__", "w", "history", "kind", "x"]) | st.text(max_size=4), inner,
        max_size=3),
    max_leaves=12)


@fuzz("message")
@given(obj=JSON_VALUES, tag=st.lists(JSON_VALUES, max_size=3), edit=st.booleans(), data=st.data())
def test_party_messages(obj, tag, edit, data):
    count("message")
    if data.draw(st.booleans()):
        obj = {"__array__": [data.draw(st.sampled_from(["float64", "int64", "uint8", "bool", "object", 3])),
                             data.draw(st.lists(st.integers(-1, 2**64), max_size=3)),
                             data.draw(st.sampled_from(["", "AAAAAAAAAAA=", "=", "AA", "not base64"]))]}
    elif data.draw(st.booleans()):
        obj = {"__bytes__": tag} if tag else {"__array__": tag}
    raw = json.dumps(obj, allow_nan=True).encode()
    if edit:
        raw = data.draw(mutated(st.just(raw)))
    try:
        value = decode(raw, limit=1 << 16)
    except ValueError as error:  # the receiver turns it into a ProtocolError naming the sender
        assert "\n" not in str(error) and str(error), str(error)
        return
    assert decode(encode(value)) is not None or value is None  # what parses travels again unchanged
    try:
        expect_array(value, np.float64, (None,), "w")
    except ValueError as error:
        assert "\n" not in str(error)


@fuzz("roster")
@given(text=st.one_of(
    st.builds(lambda entries: json.dumps({"parties": entries}).encode(),
              st.lists(st.fixed_dictionaries({"party": st.integers(0, 3) | st.text(max_size=2),
                                               "public_key": st.sampled_from(["00" * 32, "ab" * 32, "zz", 5, None,
                                                                              "11" * 31, "ff" * 32])}),
                       max_size=4)),
    st.binary(max_size=80)), edit=st.booleans(), data=st.data())
def test_roster_and_key_files(work, text, edit, data):
    count("roster")
    if edit:
        text = data.draw(mutated(st.just(text)))
    path = work / "roster.json"
    path.write_bytes(text)
    keys = outcome(path, load_roster, str(path))
    if keys is not None:
        assert all(len(k) == 32 for k in keys) and len(set(keys)) == len(keys)
    key = work / "site.key"
    key.write_bytes(text)
    os.chmod(key, 0o600)
    outcome(key, load_signing_key, str(key))


def test_the_budget_is_over_10000_inputs():
    assert sum(BUDGET.values()) >= 10_000
