"""The blocks' sums for the risk oracle: row views that copy nothing, chunks, and the CSR and dense
passes of scalar losses.

:func:`csr_scalar_pass` computes every block's risk and gradient for a
scalar loss on CSR rows in one pass over this rank's nonzeros, group by
group of consecutive blocks (:func:`csr_groups`); the sums of each
canonical block stay bitwise the same on any number of ranks.
:func:`dense_scalar_pass` does the same on dense rows with the compiled
pass of the loss (:meth:`prbmrm.kernels.scalar.CyLoss.dense_pass`), and
:func:`csr_compiled_pass` on large CSR data of few columns with the product
``X @ w`` and the compiled rest (:meth:`prbmrm.kernels.scalar.CyLoss.csr_update`).
:func:`block_scores` and :func:`block_gradients` are the products of the
non-decomposable losses (scores out, coefficients in). The products with CSR
rows are :mod:`prbmrm.kernels.sparse`'s.

Imports: numpy, scipy; of prbmrm: :mod:`prbmrm.losses.base`, :mod:`prbmrm.kernels.sparse`.
"""

import functools

import numpy as np
import scipy.sparse as sp

from ..losses.base import ScalarLoss
from .sparse import compiled_rows, csr_matvec, csr_rmatvec, csr_rows


# Rows per chunk of a block are chosen so that one chunk's nonzeros (12 bytes each)
# stay in the last-level cache between the two passes f = X w and X^T l'(f): one
# memory pass over X instead of two (1.3-1.5x faster on a 20M-nonzero shard).
_CHUNK_NONZEROS = 2**18

# Rows of a group of blocks handled in one go (the CSR pass, a line object): the
# temporaries of l and l' then stay small and in cache (64 KB each); at 32k rows
# scipy's logistic derivative takes 2.5x the time per row, and numpy's calls per group
# are already few (a9a: 4 groups on 1 rank instead of 16 blocks).
_GROUP_ROWS = 2**13


# A CSR chunk keeps only its rows with l' != 0 for X^T l' when they are fewer than this
# fraction: the gather costs less than the scatter of the others' zero terms. It costs
# about 2.5x the scatter per nonzero kept, plus a pass over the group's rows: on 8k rows
# it breaks even at 18% active with a9a's 14 nonzeros a row, at 35% with 400 (a9a's
# hinge keeps 35% active, where gathering made its risk passes 1.3x slower).
_ACTIVE_FRACTION = 0.25


# Dense values over all ranks from which the compiled dense pass is taken (one read of each row for
# f, l, l' and the gradient, against BLAS's two: about half the time on Fashion-MNIST's 47M values); below
# it BLAS's products.
DENSE_KERNEL_VALUES = 2**24

# Nonzeros over all ranks from which the compiled second half of the CSR pass is taken (a9a, 451k
# nonzeros: 0.57-0.69 ms per evaluation against 0.78-0.84 ms), and the most columns (wider data keeps
# the grouped pass, with which docs/performance.md "Many features" was measured).
CSR_KERNEL_NONZEROS = 2**18
CSR_KERNEL_COLUMNS = 2**16


class _SliceOnPrune:
    """A compressed matrix whose ``prune`` trims ``data`` and ``indices`` to nnz by slicing.

    scipy's ``prune`` copies a view of less than half of a larger array. It
    must still trim: scipy's operations (``multiply``, ``+``) build their
    result in arrays sized for the most nonzeros and leave the rest
    uninitialized, and reductions such as ``sum(axis=1)`` read ``data`` to
    its end.
    """

    def prune(self):
        """Trim the arrays to the stored nonzeros without copying them."""
        self.indices = self.indices[:self.nnz]
        self.data = self.data[:self.nnz]


class _CSCView(_SliceOnPrune, sp.csc_matrix):
    """The transpose of a :class:`_CSRView`, sharing its arrays (``X.T @ g`` copies nothing)."""

    @property
    def _csr_container(self):
        return _CSRView


class _CSRView(_SliceOnPrune, sp.csr_matrix):
    """Rows of a CSR matrix sharing its ``data`` and ``indices`` arrays.

    scipy copies the arrays handed to a sparse constructor when they are a
    view of less than half of a larger array (``prune``): every block and
    chunk of a shard would then hold a copy (twice the shard in memory), and
    each ``X.T @ g`` of a plain CSR view would copy its chunk again.
    """

    @property
    def _csc_container(self):
        return _CSCView


def row_block(X, start, stop):
    """Rows start:stop of X without copying the large arrays."""
    if not sp.issparse(X):
        return X[start:stop]
    indptr = X.indptr[start:stop + 1]
    return _CSRView((X.data[indptr[0]:indptr[-1]], X.indices[indptr[0]:indptr[-1]],
                     indptr - indptr[0]), shape=(stop - start, X.shape[1]), copy=False)


def csr_scalar(loss, X, qid):
    """Whether the evaluations of `loss` on `X` take :func:`_csr_scalar_partial`.

    For a scalar loss with the skeleton of :meth:`ScalarLoss.loss_gradient`
    (not overridden) on a CSR matrix of float64 values.
    """
    return (isinstance(loss, ScalarLoss) and type(loss).loss_gradient is ScalarLoss.loss_gradient
            and qid is None and sp.issparse(X) and X.format == "csr" and X.dtype == np.float64)


def _dense_scalar(loss, X, y, qid):
    """The compiled loss for the dense pass of `loss` on this rank's `X`, or None if it cannot run.

    It runs a built-in scalar loss (:meth:`ScalarLoss.compiled_pass`) on a
    C-contiguous float64 array with float64 labels.
    """
    if not isinstance(X, np.ndarray) or X.ndim != 2 or X.dtype != np.float64 or not X.flags.c_contiguous:
        return None
    return _compiled_loss(loss, y, qid)


def _compiled_loss(loss, y, qid):
    """The compiled loss of `loss` (:meth:`ScalarLoss.compiled_pass`) with C-contiguous float64 labels, else None."""
    if (not isinstance(loss, ScalarLoss) or qid is not None or not isinstance(y, np.ndarray)
            or y.dtype != np.float64 or y.ndim != 1 or not y.flags.c_contiguous):
        return None
    return loss.compiled_pass()


def _dense_choice(dense, values, unable):
    """The compiled loss `dense` (:func:`_dense_scalar`) for the dense pass, or None.

    Taken if every rank can (`unable` ranks cannot) and they hold at least
    :data:`DENSE_KERNEL_VALUES` `values` in all: each block's sums then come
    from the same code on any number of ranks.
    """
    return None if unable or values < DENSE_KERNEL_VALUES else dense


def _csr_compiled(loss, X, y, qid, compact):
    """The compiled loss for the CSR pass of `loss` on this rank's `X`, or None if it cannot run.

    As :func:`_dense_scalar`, on a CSR matrix of float64 values with int32
    indices and at most :data:`CSR_KERNEL_COLUMNS` columns whose blocks' sums
    are kept as dense rows (not `compact`).
    """
    if (compact or not csr_scalar(loss, X, qid) or X.shape[1] > CSR_KERNEL_COLUMNS
            or X.indices.dtype != np.int32 or X.indptr.dtype != np.int32):
        return None
    return _compiled_loss(loss, y, qid)


def _csr_choice(csr, nonzeros, unable, X, y, bounds, partials):
    """The compiled CSR pass with this rank's `csr` (:func:`_csr_compiled`) for its `X`, `y`, block `bounds`
    and `partials` (as :func:`csr_compiled_pass` takes it), or None: as :func:`_dense_choice`, from
    :data:`CSR_KERNEL_NONZEROS` `nonzeros` in all."""
    if unable or nonzeros < CSR_KERNEL_NONZEROS:
        return None
    scores = np.empty(X.shape[0])
    return scores, functools.partial(csr.csr_update, X.indptr, X.indices, X.data, scores, y, bounds, partials)


def compiled_passes(loss, X, y, qid, bounds, partials, compact, comm):
    """(blocks over all ranks, :func:`_dense_choice`, :func:`_csr_choice`) for this rank's blocks of `X`
    between `bounds` (`compact`: their sums kept on their supports), agreed by all ranks in one sum."""
    dense, csr = _dense_scalar(loss, X, y, qid), _csr_compiled(loss, X, y, qid, compact)
    counts = comm.allreduce_sum(np.array([len(bounds) - 1, 0 if dense is None else X.size, dense is None,
                                          0 if csr is None else X.nnz, csr is None], dtype=np.int64))
    return (int(counts[0]), _dense_choice(dense, counts[1], counts[2]),
            _csr_choice(csr, counts[3], counts[4], X, y, bounds, partials))


def csr_compiled_pass(csr, X, w):
    """Fill the per-block partial sums (gradient, then risk) of a scalar loss on CSR rows, in place.

    The rows' scores (as :func:`csr_scalar_pass` forms them), then the
    compiled rest (``csr`` is :func:`_csr_choice`'s, bound to the partial sums).
    """
    scores, update = csr
    csr_matvec(X.indptr, X.indices, X.data, np.ascontiguousarray(w, dtype=np.float64), scores)
    update()


def dense_scalar_pass(dense, X, y, bounds, w, partials):
    """Fill the per-block `partials` (gradient, then risk) of a scalar loss on dense rows, in place.

    One pass over each row, compiled; `dense` is :func:`_dense_choice`'s compiled loss.
    """
    dense.dense_pass(X, y, np.ascontiguousarray(w, dtype=np.float64), bounds, partials)


def block_scores(X, blocks, w, out=None):
    """The scores ``X @ w`` of this rank's rows, as the blocks (`blocks`: their ``(X, y, qid)`` views) give them.

    CSR rows (:func:`~prbmrm.kernels.sparse.compiled_rows`) in one compiled pass, into `out` if given
    (float64, one per row): a row's sum is scipy's, whichever block holds it.
    """
    if compiled_rows(X):
        scores = np.empty(X.shape[0]) if out is None else out
        csr_matvec(X.indptr, X.indices, X.data, np.ascontiguousarray(w, dtype=np.float64), scores)
        return scores
    return np.concatenate([block @ w for block, _, _ in blocks])


def block_gradients(X, blocks, bounds, v, partials):
    """Write ``X_b.T @ v_b`` of each block b (rows between `bounds`) into the gradient part of ``partials[b]``.

    CSR rows (:func:`~prbmrm.kernels.sparse.compiled_rows`) through the compiled loop, which adds
    in the order of scipy's ``X_b.T @ v_b`` (bitwise its result) without
    its checks and temporaries of length d.
    """
    if compiled_rows(X):
        v = np.ascontiguousarray(v, dtype=np.float64)
        for partial, a, b in zip(partials, bounds[:-1], bounds[1:]):
            partial[:-1] = 0.0
            csr_rmatvec(X.indptr[a:b + 1], X.indices, X.data, v[a:b], partial[:-1])
        return
    for partial, (block, _, _), a, b in zip(partials, blocks, bounds[:-1], bounds[1:]):
        partial[:-1] = block.T @ v[a:b]


def same_index_dtype(X):
    """`X`, or once a copy whose indptr has the dtype of its indices (the CSR loops take one type)."""
    if X.indptr.dtype == X.indices.dtype:
        return X
    index = np.promote_types(X.indptr.dtype, X.indices.dtype)
    return sp.csr_matrix((X.data, X.indices.astype(index, copy=False), X.indptr.astype(index, copy=False)),
                         shape=X.shape, copy=False)


def csr_groups(X, y, bounds):
    """Plan the grouped CSR pass over the blocks with local row boundaries `bounds`.

    Each block is cut into chunks of about ``_CHUNK_NONZEROS`` nonzeros by
    :func:`chunk_bounds` (relative to the block, so the cuts do not depend
    on the ranks), and consecutive chunks are packed into groups of at most
    that many nonzeros and ``_GROUP_ROWS`` rows (a chunk above either makes
    a group of its own).

    Returns
    -------
    list of (X, y, starts, owners)
        Per group: its rows (views), the row boundaries of its chunks
        relative to the group (one more than chunks), and the block of each
        chunk (its row in the partial sums).
    """
    chunks = [(block, a + s, a + t) for block, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))
              for s, t in chunk_bounds(X, a, b)]
    groups, members = [], []
    for chunk in chunks + [None]:
        if members and (chunk is None or X.indptr[chunk[2]] - X.indptr[members[0][1]] > _CHUNK_NONZEROS
                        or chunk[2] - members[0][1] > _GROUP_ROWS):
            first = members[0][1]
            starts = np.array([a - first for _, a, _ in members] + [members[-1][2] - first], dtype=np.intp)
            groups.append((row_block(X, first, members[-1][2]), row_range(y, first, members[-1][2]), starts,
                           [block for block, _, _ in members]))
            members = []
        members.append(chunk)
    return groups


def block_groups(bounds):
    """Consecutive blocks (local row boundaries `bounds`) in groups of at most ``_GROUP_ROWS`` rows
    (a larger block makes a group of its own): ``(first block, end block)`` per group."""
    groups, first = [], 0
    for block in range(1, len(bounds)):
        if block == len(bounds) - 1 or bounds[block + 1] - bounds[first] > _GROUP_ROWS:
            groups.append((first, block))
            first = block
    return groups


def csr_compact_pass(loss, blocks, w, scratch, partials):
    """Fill :class:`~prbmrm.distributed.comm.SupportRows` `partials`: per block, :func:`csr_scalar_pass` of its groups
    (``blocks[i]``) into the dense row `scratch`, kept on the block's support.

    `scratch` must be zero on entry and is zero on return: the pass writes only on the block's support (its
    columns and the risk), so clearing that is enough, not a row of length d per block.
    """
    try:
        for i, groups in enumerate(blocks):
            csr_scalar_pass(loss, groups, w, scratch[None], zeroed=True)
            partials.store(i, scratch)
            scratch[partials.index[i]] = 0.0
    except BaseException:
        scratch.fill(0.0)
        raise


def csr_scalar_pass(loss, groups, w, partials, zeroed=False):
    """Fill the per-block `partials` (gradient, then risk) of a scalar loss on CSR groups, in place.

    Per group of rows (:func:`csr_groups`): ``f = X w`` in one pass over
    its nonzeros (which then stay in cache), l and l' on f once, then per
    chunk its risk (``np.sum`` of its losses) and ``X^T l'`` added into its
    block's gradient by :func:`prbmrm.kernels.sparse.csr_rmatvec` on the CSR
    arrays as they are (no conversion, no temporary of length d). Rows with ``l' = 0`` (hinge: the examples
    beyond the margin) add nothing, and are left out when few rows of the
    group are active. The kernel adds a chunk's terms in row order whatever
    rows are skipped (a zero term leaves every sum as it is, its sign
    included: the gradient starts at +0 and never becomes -0), so a block's
    sums are the same bitwise wherever the group cuts fall: on any number
    of ranks, and as one call per chunk would form them. `zeroed`: `partials` are zero already.
    """
    if not zeroed:
        partials[:] = 0.0
    w = np.ascontiguousarray(w, dtype=np.float64)
    for X, y, starts, owners in groups:
        # The loops of prbmrm.kernels.sparse: through X @ w and X[rows] scipy's
        # checks cost more than the products on a9a-sized groups.
        f = np.empty(X.shape[0])
        csr_matvec(X.indptr, X.indices, X.data, w, f)
        values = loss.value(f, y)
        # An overflowed loss (inf in l') is reported by the solver's finiteness check, without a warning here.
        with np.errstate(invalid="ignore", over="ignore"):
            slopes = np.asarray(loss.derivative(f, y), dtype=np.float64)
        indptr, indices, data, cuts = X.indptr, X.indices, X.data, starts
        if np.count_nonzero(slopes) < _ACTIVE_FRACTION * len(slopes):
            active = np.flatnonzero(slopes)
            indptr, indices, data = _csr_rows(X, active)
            slopes, cuts = slopes[active], np.searchsorted(active, starts)
        for block, a, b, c, e in zip(owners, starts[:-1], starts[1:], cuts[:-1], cuts[1:]):
            partial = partials[block]
            partial[-1] += float(np.sum(values[a:b]))
            # The loop reads the rows' nonzeros at the absolute offsets of indptr[c:e + 1].
            csr_rmatvec(indptr[c:e + 1], indices, data, slopes[c:e], partial[:-1])


def _csr_rows(X, rows):
    """``(indptr, indices, data)`` of the rows `rows` (increasing) of the CSR matrix X."""
    starts = X.indptr[rows]
    indptr = np.zeros(len(rows) + 1, dtype=X.indptr.dtype)
    np.cumsum(X.indptr[rows + 1] - starts, out=indptr[1:])
    indices = np.empty(indptr[-1], dtype=X.indices.dtype)
    data = np.empty(indptr[-1])
    csr_rows(X.indptr, X.indices, X.data, rows.astype(np.intp, copy=False), indptr, indices, data)
    return indptr, indices, data


def row_range(a, start, stop):
    """Entries start:stop of `a`, or None if `a` is None."""
    return None if a is None else a[start:stop]


def chunk_bounds(X, start, stop):
    """Row ranges, relative to `start`, of consecutive chunks of rows start:stop of about
    ``_CHUNK_NONZEROS`` nonzeros each (for ragged examples: values of their parts)."""
    if sp.issparse(X):
        nonzeros = X.indptr[start:stop + 1] - X.indptr[start]
    elif hasattr(X, "x_offsets"):
        nonzeros = (X.x_offsets[start:stop + 1] - X.x_offsets[start]) * X.shape[1]
    else:
        nonzeros = np.arange(stop - start + 1) * X.shape[1]
    cuts = np.searchsorted(nonzeros, np.arange(_CHUNK_NONZEROS, nonzeros[-1], _CHUNK_NONZEROS))
    edges = np.unique(np.concatenate([[0], cuts, [stop - start]]))
    return list(zip(edges[:-1], edges[1:]))
