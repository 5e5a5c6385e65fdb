"""The distributed loader: which rank reads which rows of a shard set, or of arrays in memory.

The functions that run on every rank (:func:`load_local`, :func:`split_local`) are handed a
communicator (:class:`prbmrm.distributed.comm.SerialComm` or :class:`prbmrm.distributed.comm.MPIComm`) and use only
its ``rank``, ``size``, ``check``, ``bcast_object`` and ``gather_counts``: this package never
imports MPI. A problem on any rank becomes the same :class:`prbmrm.errors.CollectiveError`
on every rank. Rows are cut into canonical blocks that do not depend on the number of
ranks, so sums over them, and results, are bitwise the same on any number of ranks.

Imports: h5py, numpy, scipy, :mod:`prbmrm.io.arrays`, :mod:`prbmrm.io.files` and :mod:`prbmrm.io.shards`.
"""

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..errors import CollectiveError, InputError
from .files import check_memory
from .arrays import (_as_matrix, _as_qid, check_finite, _check_indicator, _fmt_num, _fmt_values,
    _INDEX_LIMIT, _prepare_labels, _raw_negative, row_bounds, _row_costs, STRUCTURED, _with_bias)
from .shards import _AGREED, _conversions, LAYOUTS, list_shards, open_shard, _shard_meta, spec_label, survey_shards

# Canonical blocks of in-memory data (split_local): at most 64, at least 8, and otherwise one
# per 2**14 stored values, so that on small data (scikit-learn's digits: 1,797 x 64) the
# per-block call of the loss does not cost more than the block's arithmetic.
_SPLIT_BLOCKS, _SPLIT_MIN_BLOCKS, _SPLIT_BLOCK_COST = 64, 8, 2**14
# Canonical blocks of a shard set (files are cut, not joined): at most 256, so that far more ranks find work,
# at least 64, and otherwise one per 2**13 stored values: every block is added exactly in fixed point at every
# evaluation (d + 1 values of it), which on a9a's 127-row blocks cost a fifth of a Newton step's time.
_SHARD_BLOCKS, _SHARD_MIN_BLOCKS, _SHARD_BLOCK_COST = 256, 64, 2**13
_PARTIALS_BUDGET = 2**23  # floats of per-block partial sums a shard set's blocks may need (64 MiB)
_DENSE_READ = 2**20  # entries of the dense array filled per read of a CSR shard (a few MB at a time)

DENSE_DENSITY = 0.4
"""CSR data at least this dense (nonzeros / (rows x features) over the whole
set) is held in memory as a dense C-contiguous array, multiplied by BLAS:
a dense pass reads 8 bytes per entry at about twice the speed per byte of
scipy's CSR kernel, which reads 12 per nonzero (value and int32 index), so
dense is the faster above a density of about 1/3, and at 0.4 costs at most
1.7x the memory of CSR (at 2/3 and above, less). :func:`load_local` and
:func:`split_local` take ``dense=True`` or ``False`` to force either; the
shard files keep their layout (``python -m prbmrm.cli.shard --dense`` writes
dense ones)."""


@dataclass
class LocalData:
    """The rows of the data set held by one rank.

    Attributes
    ----------
    X : scipy.sparse.csr_matrix, numpy.ndarray or prbmrm.structured.RaggedExamples
        Local features, float64: CSR with int32 ``indices`` and ``indptr``
        where the sizes allow (int64 otherwise), or a C-contiguous array
        (dense shards, and CSR ones of density at least :data:`DENSE_DENSITY`).
        With `bias` the last column is a constant 1. For structured data
        (label kind ``"structured"``) the ragged examples with their labels.
    y : numpy.ndarray or None
        float64 (n_local,) labels, float64 (n_local, k) targets for
        multioutput data, or for multilabel data an int8
        (n_local, k) 0/1 indicator whose columns follow `classes`; None
        for structured data.
    qid : numpy.ndarray or None
        int64 (n_local,) query ids, or None when the data has none.
    n_features : int
        Number of features, *without* the bias column.
    n_examples_total : int
        Number of rows over all ranks.
    label_kind : str
        One of :data:`LABEL_KINDS`.
    classes : numpy.ndarray or None
        Sorted distinct labels over all ranks (label ids for multilabel
        data); None for real labels.
    files : list of str
        The shard files this rank read (empty for in-memory data).
    bias : bool
        Whether a constant-1 column was appended to `X`.
    row_offset : int
        Global index of the first local row (ranks hold contiguous blocks
        in rank order).
    positive : float or None
        The label mapped to +1 (all others to -1) when the labels were
        mapped one-vs-rest (``--positive``), else None.
    negative : float or None
        With `positive`, the one other label when the raw labels were exactly two.
    exact_width : bool
        Whether `n_features` is the data's true width (dense or CSV input,
        or ``--n-features``) rather than the largest SVMlight feature index.
    blocks : list of int
        Local row boundaries ``[0, n_1, ..., n_local]`` of the canonical
        blocks of rows held here (:func:`load_local`: up to 256 over a shard
        set; :func:`split_local`: up to 64), which do not depend on the number
        of ranks. Summing per block, exactly, makes results independent of the rank count.
    """

    X: object
    y: np.ndarray
    qid: object
    n_features: int
    n_examples_total: int
    label_kind: str
    classes: object
    files: list = field(default_factory=list)
    bias: bool = False
    row_offset: int = 0
    blocks: list = None
    positive: object = None
    exact_width: bool = True
    negative: object = None

    def __post_init__(self):
        if self.blocks is None:
            self.blocks = [0, self.n_local]

    @property
    def n_local(self):
        """int: Number of rows held by this rank."""
        return int(self.X.shape[0])


def _canonical_blocks(metas, ranks):
    """The canonical blocks of a shard set: (file number, first row, end row), in order.

    Each file is cut into ceil(K / S) blocks of equal rows (at most one per
    row) with K = max(ranks, min(rows, C, B)), C = min(256, max(64, v / 2^13))
    for v stored values (nonzeros, or rows x features of dense files) and
    rows: the cut does not depend on the number of ranks up to
    min(rows, C, B) (or up to S), so neither do
    the sums (the blocks' partial sums are added exactly,
    :meth:`prbmrm.distributed.comm.SerialComm.exact_sum`, so how blocks are
    grouped on ranks does not matter): models are bitwise equal and a
    checkpoint resumes on any such rank count. Beyond it each rank still
    finds work, on blocks of its own. Every block holds a partial gradient of
    d + 1 floats per evaluation, so B = ``_PARTIALS_BUDGET`` / (d + 1) keeps
    them within 64 MiB over all ranks on wide data (text-like sets of millions
    of features get a block per file). Files with query ids or structured
    examples stay whole (a query or example is never split).
    """
    S, total = len(metas), sum(m["n"] for m in metas)
    whole = metas[0]["has_qid"] or metas[0]["kind"] == STRUCTURED
    wide = max(1, _PARTIALS_BUDGET // (metas[0]["d"] + 1))
    stored = sum(m["nnz"] if m["sparse"] else m["n"] * m["d"] for m in metas) + total
    by_cost = min(_SHARD_BLOCKS, max(_SHARD_MIN_BLOCKS, stored // _SHARD_BLOCK_COST))
    per_file = 1 if whole else -(-max(ranks, min(total, by_cost, wide)) // S)
    blocks = []
    for i, m in enumerate(metas):
        c = max(1, min(per_file, m["n"]))
        blocks += [(i, j * m["n"] // c, (j + 1) * m["n"] // c) for j in range(c)]
    return blocks


def _slice_meta(meta, lo, hi):
    """`meta` of a whole shard restricted to its rows lo..hi (what :func:`read_shard_rows` reads)."""
    part = dict(meta, n=hi - lo, lo=lo)
    if meta["sparse"]:
        indptr = meta["indptr"][lo:hi + 1]
        part.update(indptr=indptr - indptr[0], nnz=int(indptr[-1] - indptr[0]), first_value=int(indptr[0]))
    return part


def read_shard_rows(metas, bias, as_dense=False):
    """Read this rank's checked shards into one X, y, qid (preallocated: no
    concatenation copies) and validate the values.

    CSR shards are read into a dense X if `as_dense`. Structured shards give
    ragged examples (with their labels) as X, and y None.
    """
    if metas[0]["kind"] in LAYOUTS:
        return LAYOUTS[metas[0]["kind"]].read(metas, bias), None, None
    n, d = sum(m["n"] for m in metas), metas[0]["d"]
    kind, classes, sparse = metas[0]["kind"], metas[0]["classes"], metas[0]["sparse"]
    y = (np.empty((n, classes.size), dtype=np.int8) if kind == "multilabel"
         else np.empty((n, classes.size)) if kind == "multioutput" else np.empty(n))
    qid = np.empty(n, dtype=np.int64) if metas[0]["has_qid"] else None
    csr = sparse and not as_dense
    if csr:
        nnz = sum(m["nnz"] for m in metas)
        idx = np.int32 if max(nnz, d) < _INDEX_LIMIT else np.int64
        data, indices, indptr = np.empty(nnz), np.empty(nnz, idx), np.zeros(n + 1, idx)
    else:
        check_memory(metas[0]["path"], 8 * n * (d + bias), f"holding {n} rows of {d + bias} features dense")
        X = np.zeros((n, d + bias)) if sparse else np.empty((n, d + bias))
    row = pos = 0
    for m in metas:
        path, rows, vals = m["path"], np.s_[row:row + m["n"]], np.s_[pos:pos + m["nnz"]]
        # Only this rank's rows of the file: a row range, and its range of values.
        lo, first = m.get("lo", 0), m.get("first_value", 0)
        source, source_vals = np.s_[lo:lo + m["n"]], np.s_[first:first + m["nnz"]]
        with open_shard(path) as f:
            if csr and m["nnz"]:
                f["X/data"].read_direct(data, source_sel=source_vals, dest_sel=vals)
                f["X/indices"].read_direct(indices, source_sel=source_vals, dest_sel=vals)
            elif sparse and m["nnz"]:
                _scatter_csr(f, m, X[rows])
            elif not sparse and m["n"] and d:
                f["X"].read_direct(X, source_sel=np.s_[lo:lo + m["n"], 0:d], dest_sel=np.s_[rows, 0:d])
            if m["n"]:
                f["y"].read_direct(y, source_sel=source, dest_sel=rows)
                if qid is not None:
                    f["qid"].read_direct(qid, source_sel=source, dest_sel=rows)
        if csr:
            indptr[row:row + m["n"] + 1] = m["indptr"] + pos
            _check_indices(indices[vals], d, path)
            _check_unique_indices(indices[vals], m["indptr"], path, row_offset=lo)
            check_finite(data[vals], path, indptr=m["indptr"], row_offset=lo)
        elif not sparse:
            check_finite(X[rows, :d], path, row_offset=lo)
        if kind == "multilabel":
            _check_indicator(y[rows], path)
        else:
            check_finite(y[rows], path, "label")
            bad = (np.flatnonzero(~np.isin(y[rows], classes))
                   if kind not in ("real", "multioutput") else [])
            if len(bad):
                raise InputError(f"{path}: row {lo + bad[0] + 1} has label {_fmt_num(y[row + bad[0]])}"
                                 f", not one of the classes [{_fmt_values(classes)}]")
        row, pos = row + m["n"], pos + m["nnz"]
    if csr:
        X = _with_bias(sp.csr_matrix((data, indices, indptr), shape=(n, d), copy=False), bias)
    else:
        X[:, d:] = 1.0  # after the rows: scipy's toarray(out=...) zeroes whole rows, the bias column too
    return X, y, qid


def _check_unique_indices(indices, indptr, path, row_offset=0):
    """Raise naming the first row of a CSR shard that gives a column twice (``X @ w`` would add the values).

    Rows with increasing indices (what the writer makes) pass in one
    vectorized comparison; only otherwise are the indices sorted per row.
    """
    out_of_order = indices[1:] <= indices[:-1]  # position k: value k + 1 does not follow value k up
    starts = np.asarray(indptr[1:-1])
    out_of_order[starts[(starts > 0) & (starts < indices.size)] - 1] = False  # a row may start low
    if out_of_order.any():  # not only at the start of a row
        rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        order = np.lexsort((indices, rows))
        same = np.flatnonzero((indices[order][1:] == indices[order][:-1]) & (rows[order][1:] == rows[order][:-1]))
        if len(same):
            at = order[same[0]]
            raise InputError(f"{path}: row {rows[at] + row_offset + 1} gives column {indices[at]} twice "
                             "(duplicate index in /X/indices)")


def _check_indices(indices, d, path):
    if indices.size and (indices.min() < 0 or indices.max() >= d):
        raise InputError(f"{path}: /X/indices has a feature index out of range [0, {d})")


def _scatter_csr(f, m, out):
    """Fill the zeroed dense rows `out` with the CSR /X of the open shard `m`, checking it.

    A few MB are read at a time: the shard's CSR arrays are never all in memory.
    """
    path, indptr, d = m["path"], m["indptr"], m["d"]
    first, rows = m.get("first_value", 0), m.get("lo", 0)  # where this rank's rows start in the file
    step = max(1, _DENSE_READ // max(d, 1))
    for a in range(0, m["n"], step):
        b = min(a + step, m["n"])
        lo, hi = int(indptr[a]), int(indptr[b])
        if hi == lo:
            continue
        values, columns = f["X/data"][first + lo:first + hi], f["X/indices"][first + lo:first + hi]
        starts = indptr[a:b + 1] - lo
        _check_indices(columns, d, path)
        _check_unique_indices(columns, starts, path, row_offset=rows + a)
        check_finite(values, path, indptr=starts, row_offset=rows + a)
        # scipy's CSR-to-dense loop writes straight into the rows (no index arrays of the block's size).
        sp.csr_matrix((values, columns, starts), shape=(b - a, out.shape[1])).toarray(out=out[a:b])


def _dense_layout(sparse, nonzeros, rows, features, dense):
    """Whether to hold X dense in memory: `dense` if given, else CSR data of density >= DENSE_DENSITY."""
    if dense is not None:
        return bool(dense)
    return not sparse or nonzeros >= DENSE_DENSITY * rows * features


def collectively(comm, fn, *args):
    """fn(*args) on every rank; an InputError on any rank is raised on all (comm.check)."""
    error = result = None
    try:
        result = fn(*args)
    except InputError as exc:
        error = exc
    comm.check(error)
    return result


def load_local(spec, comm, *, bias=False, dense=None):
    """Load this rank's block of shard files; validate them on every rank together.

    Rank 0 checks every file's attributes and structure (shapes, indptr) and
    that the files agree; a glob may name the shards of several conversions
    (directories), which must agree on features, labels and label mapping.
    The rows are cut into canonical blocks (:func:`_canonical_blocks`) that
    do not depend on the number of ranks P (64 to 256 by the data's size,
    fewer on very wide data), and rank r reads only the row ranges of its blocks: any P up to
    the number of rows works, and results are bitwise equal for every P up
    to the number of blocks. Files with query ids or
    structured examples stay whole (then P is at most the number of files).

    Parameters
    ----------
    spec : str, os.PathLike or sequence of them
        Shard files, as for :func:`list_shards`.
    comm : prbmrm.distributed.comm.SerialComm or prbmrm.distributed.comm.MPIComm
        Communicator; every rank must call this function.
    bias : bool, default False
        Append a constant-1 feature column.
    dense : bool or None, default None
        Hold X as a dense array (True) or as the shards store it (False);
        None: dense if the shards are, or if their CSR has a density of at
        least :data:`DENSE_DENSITY` over all shards (the same choice on
        every rank, so sums stay independent of the rank count).

    Returns
    -------
    LocalData

    Raises
    ------
    prbmrm.errors.CollectiveError
        On every rank, if any rank found a problem: no shard files, fewer
        files than ranks, a missing, truncated or corrupt file, a file of
        another format or version, inconsistent shapes, non-finite values,
        or shards that disagree (on features, labels, query ids, row count,
        or dense and sparse ones mixed).
    """
    def survey():
        files = list_shards(spec)
        light = [k for k, _, _ in _AGREED] + ["path", "n", "nnz", "exact", "negative"]
        return ([{key: m[key] for key in light} for m in survey_shards(files, spec_label(spec, files))],
                spec_label(spec, files))

    error = surveyed = None
    if comm.is_root:  # one rank checks every file's attributes; the others get the verdict
        try:
            surveyed = survey()
        except InputError as exc:
            error = exc
    comm.check(error)
    light, label = comm.bcast_object(surveyed)
    blocks = _canonical_blocks(light, comm.size)
    P, G = comm.size, len(blocks)
    if G < P:
        unit = "shard file" if light[0]["has_qid"] or light[0]["kind"] == STRUCTURED else "row"
        raise CollectiveError(f"{label}: {G} {unit}{'s' if G != 1 else ''} for {P} ranks: need at least "
                              f"one {unit} per rank" + (" (files with query ids or structured examples "
                                                        "are not split)" if unit != "row" else ""))
    mine = blocks[comm.rank * G // P:(comm.rank + 1) * G // P]
    files = [m["path"] for m in light]
    conversions = _conversions(files, label)

    first = light[0]
    as_dense = _dense_layout(first["sparse"], sum(m["nnz"] for m in light), sum(m["n"] for m in light),
                             first["d"], dense)

    def read_mine():
        pieces = {}  # file number -> (first row, end row) of this rank's blocks in it
        for i, lo, hi in mine:
            pieces[i] = (min(lo, pieces.get(i, (lo, hi))[0]), hi)
        metas = []
        for i, (lo, hi) in pieces.items():
            whole = _shard_meta(files[i], *conversions[i])
            metas.append(whole if (lo, hi) == (0, whole["n"]) else _slice_meta(whole, lo, hi))
        return metas, read_shard_rows(metas, bias, as_dense)

    metas, (X, y, qid) = collectively(comm, read_mine)
    row_counts = [hi - lo for _, lo, hi in mine]
    offset = sum(hi - lo for _, lo, hi in blocks[:comm.rank * G // P])
    return LocalData(X=X, y=y, qid=qid, n_features=first["d"],
                     n_examples_total=sum(m["n"] for m in light), label_kind=first["kind"],
                     classes=first["classes"], files=[m["path"] for m in metas],
                     bias=bool(bias), row_offset=int(offset),
                     blocks=[0] + np.cumsum(row_counts).tolist(),
                     positive=first["positive"], exact_width=first["exact"], negative=first["negative"])


def split_local(X, y, comm, *, qid=None, bias=False, label_kind=None, classes=None,
                source="", positive=None, exact_width=True, dense=None):
    """Keep this rank's contiguous block of in-memory data present on every rank.

    Every rank holds the same full arrays (the demo data, the Python API) and
    keeps the rows it would have loaded had they been written by
    :func:`write_shards` into K = max(P, min(units, 64, max(8, c / 2**14)))
    files (units: rows, or queries; c: the stored values plus the rows). The
    K blocks do not depend on P up to min(64, max(8, c / 2**14)) ranks.

    Parameters
    ----------
    X : array_like or scipy.sparse matrix, shape (n, d)
        All the features (identical on every rank).
    y : array_like
        All the labels (n,), or multilabel label sets / 2-D indicator.
    comm : prbmrm.distributed.comm.SerialComm or prbmrm.distributed.comm.MPIComm
        Communicator; every rank must call this function.
    qid : array_like, optional
        Query ids (n,); each query must be a contiguous run of rows.
    bias : bool, default False
        Append a constant-1 feature column.
    label_kind : str, optional
        Override the inferred label kind (e.g. ``"real"`` for integer-valued
        regression targets).
    classes : array_like, optional
        Override the inferred classes.
    source : str, optional
        Name of the data, used in messages.
    positive : float, optional
        One-vs-rest: this label becomes +1 and every other label -1.
    exact_width : bool, default True
        Recorded in :attr:`LocalData.exact_width`.
    dense : bool or None, default None
        Keep this rank's rows as a dense array (True) or as given (False);
        None: dense if `X` is, or if it is sparse with a density of at least
        :data:`DENSE_DENSITY`.

    Returns
    -------
    LocalData

    Raises
    ------
    prbmrm.errors.CollectiveError
        On every rank, if the data are inconsistent or not finite, or there
        are fewer rows (queries) than ranks.
    """
    where = source or "input arrays"

    def keep_mine():
        A = _as_matrix(X, where)
        n, d = A.shape
        if n == 0:
            raise InputError(f"{where}: no rows")
        Y, kind, found = _prepare_labels(y, n, where, label_kind=label_kind, classes=classes,
                                         positive=positive)
        q = _as_qid(qid, n, where)
        blocks = rank_blocks(_row_costs(A, not sp.issparse(A)), q, comm, where)
        a, b = blocks[0], blocks[-1]
        mine = A[a:b]
        check_finite(mine, where, row_offset=a)
        if sp.issparse(mine) and _dense_layout(True, A.nnz, n, d, dense):
            mine = mine.toarray()
        return LocalData(X=_with_bias(mine, bias), y=np.ascontiguousarray(Y[a:b]),
                         qid=None if q is None else q[a:b].copy(), n_features=d,
                         n_examples_total=n, label_kind=kind, classes=found, files=[],
                         bias=bool(bias), row_offset=a, blocks=[j - a for j in blocks],
                         positive=positive, exact_width=exact_width, negative=_raw_negative(y, positive))

    return collectively(comm, keep_mine)


def rank_blocks(costs, qid, comm, where, unit=("row", "rows")):
    """Global boundaries of this rank's canonical blocks of in-memory rows (or queries).

    The rows are cut as if sharded into K = max(P, min(units, 64, max(8,
    sum(costs) // 2**14))) files (:func:`row_bounds` on the rows' `costs`),
    which do not depend on the number of ranks P up to K; each rank keeps whole blocks, as
    :func:`load_local` assigns files. K > units only when P > units, and then
    row_bounds reports too few rows for the ranks.
    """
    P, r = comm.size, comm.rank
    n_units = len(costs) if qid is None else int(np.count_nonzero(qid[1:] != qid[:-1])) + 1
    by_cost = max(_SPLIT_MIN_BLOCKS, int(np.sum(costs)) // _SPLIT_BLOCK_COST)
    K = max(P, min(n_units, _SPLIT_BLOCKS, by_cost))
    bounds = row_bounds(costs, qid, K, where, what="ranks", unit=unit)
    return bounds[r * K // P:(r + 1) * K // P + 1]
