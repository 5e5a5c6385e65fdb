"""The bundle: cutting planes of R_emp, dense or sparse, their Gram matrix and products.

Imports: numpy; of prbmrm: :mod:`prbmrm.kernels.planes`.
"""

import math
import mmap

import numpy as np

from ..kernels.planes import GROUP, fill_support, scatter_add_group, sparse_dot, sparse_dot_group, sparse_dots

SPARSE_MIN_DIM = 2 ** 16
"""The smallest dimension at which a :class:`Bundle` stores planes sparsely by default."""

_DENSE_BYTES = 8  # per coordinate of a dense plane: the most any plane of a sparse bundle takes


class Bundle:
    """Cutting planes ``R_emp(w) >= <a_i, w> + b_i`` with their Gram matrix kept up to date.

    Rows of :attr:`A` are the subgradients a_i. Adding a plane costs one
    product ``A @ a`` (O(t d)) to extend the Gram matrix; storage grows by
    doubling so the hot path does not reallocate every iteration, up to
    `max_size` rows if given.

    Sparse planes: with `sparse`, a plane whose support holds less than half
    of the `dim` coordinates is stored as its indices and values (12 bytes
    per nonzero instead of 8 per coordinate), the others as dense vectors;
    the Gram row of a new plane, :meth:`combine` (``A^T alpha``, hence w),
    :meth:`products` (``A w``) and aggregation then cost O(nonzeros of the
    planes) plus O(d) for the one dense result, not O(t d). Sums run plane
    by plane in a fixed order, so the results depend on the planes only (not
    on the ranks), but they may differ in the last bits from the dense
    bundle's BLAS products.

    :meth:`add` may be given a point w (the proximal method's center): a
    sparse bundle then records ``A w``, in the same pass over the planes as
    the Gram row, or, if the record is at that same array already, extends
    it by the new plane's product; :meth:`products` at that array returns
    the record, kept up to date as planes are dropped and aggregated,
    instead of another pass over the planes (bitwise the same values). The
    record assumes the point is not modified in place.

    Parameters
    ----------
    dim : int
        Length of the subgradients.
    metric : callable, optional
        ``metric(a) -> M a`` for a positive definite M: the Gram matrix is then
        ``A M A^T`` (the quadratic-form regularizer's ``B^-1``); identity by default.
    max_size : int, optional
        Most planes ever held (storage never exceeds it); the solver keeps
        within it with :meth:`aggregate_oldest`. Unlimited by default.
    sparse : bool, optional
        Store planes of small support sparsely; by default when `dim` is at
        least :data:`SPARSE_MIN_DIM` (below it a dense plane is small anyway,
        and results stay those of the dense bundle).
    max_bytes : int, optional
        A budget for the planes' storage (:attr:`nbytes`), at least two
        dense planes' worth. A dense bundle turns it into `max_size`
        (:func:`planes_within`); a sparse one counts the bytes its planes
        hold, so planes of small support fit in greater number, and
        :meth:`make_room` aggregates when one more plane might not fit.
    """

    def __init__(self, dim, metric=None, max_size=None, sparse=None, max_bytes=None):
        if max_size is not None and max_size < 2:
            raise ValueError(f"a bundle holds at least 2 planes, got max_size={max_size}")
        self._metric = metric
        self.dim = dim
        self.sparse = dim >= SPARSE_MIN_DIM if sparse is None else bool(sparse)
        self.max_bytes = None
        if max_bytes and not self.sparse:
            within = planes_within(max_bytes, dim)
            max_size = within if max_size is None else min(max_size, within)
        elif max_bytes:
            self.max_bytes = max(int(max_bytes), 2 * _DENSE_BYTES * dim)
        self.max_size = max_size
        capacity = 8 if max_size is None else min(8, max_size)
        # With a limit the planes' storage is reserved whole at once: the pages of
        # np.empty are only committed as planes are written, and growing never
        # holds an old and a new copy of the planes (twice the budget) at once.
        # Sparse planes are separate arrays, one (indices or None, values) pair each.
        self._A = None if self.sparse else np.empty((capacity if max_size is None else max_size, dim))
        self._planes = []
        self._b = np.empty(capacity)
        self._gram = np.empty((capacity, capacity))
        self._idle = np.empty(capacity, dtype=np.int64)
        self.size = 0
        self._point, self._at_point = None, np.zeros(0)  # the point of add(point=...) and A w there
        self.radius, self.slack = math.inf, 0.0

    radius = math.inf
    """float: every plane is below R_emp at every point within this distance of the origin (planes of
    rounded sums, lowered for a radius: :func:`prbmrm.solvers.base.rounding_margin`; inf for exact planes)."""

    slack = 0.0
    """float: the largest ``||error of a||_2`` of a plane: how much an offset must drop per unit of radius
    to hold farther out (:meth:`widen`)."""

    def widen(self, radius):
        """Lower every offset so that the planes hold within `radius` (of another problem's minimizer)."""
        if radius > self.radius and self.slack > 0.0:
            self._b[:self.size] -= self.slack * (radius - self.radius) * 1.0001
        self.radius = max(self.radius, radius) if self.slack > 0.0 else self.radius

    @property
    def A(self):
        """ndarray of shape (t, dim): the subgradients, one per row (a dense copy for sparse planes)."""
        if not self.sparse:
            return self._A[:self.size]
        A = np.zeros((self.size, self.dim))
        for row, (index, values) in zip(A, self._planes):
            row[slice(None) if index is None else index] = values
        return A

    @property
    def b(self):
        """ndarray of shape (t,): the offsets."""
        return self._b[:self.size]

    @property
    def gram(self):
        """ndarray of shape (t, t): ``A @ A.T`` (``A M A^T`` with a metric)."""
        return self._gram[:self.size, :self.size]

    @property
    def gram_buffer(self):
        """ndarray: the C-contiguous storage whose leading t x t block is :attr:`gram` (for compiled kernels)."""
        return self._gram

    @property
    def nbytes(self):
        """int: the bytes the planes' storage holds (reserved, for a dense bundle).

        A plane whose indices are those of the plane added before it shares
        that array (:meth:`add`), but each plane counts it: the budget's
        decisions do not depend on sharing, and the memory held is at most this.
        """
        if not self.sparse:
            return self._A.nbytes
        return sum(_plane_bytes(plane) for plane in self._planes)

    def combine(self, alpha, out=None):
        """Return ``A^T alpha`` (w is ``-A^T alpha / lam`` for the L2 regularizer).

        Sparse planes sum into `out` if given (an array of length `dim`, overwritten), else into a new
        array; dense planes always give a new array (BLAS's product, as without `out`).
        """
        if not self.sparse:
            return alpha @ self.A
        return _combine(alpha, self._planes, self.dim, out)

    def products(self, w):
        """Return ``A w``, the planes' slopes at `w` (the record, if `w` is the point of the last :meth:`add`)."""
        if w is self._point:
            return self._at_point.copy()
        if not self.sparse:
            return self.A @ w
        return _dot_planes(self._planes, w)

    def add(self, a, b, point=None):
        """Append the plane (a, b); with a `point` (an array not modified later), record ``A point``.

        The record (sparse planes only) makes :meth:`products` at `point`
        free until an ``add`` at another point or none.
        """
        t = self.size
        if t == len(self._b):
            if t == self.max_size:
                raise ValueError(f"the bundle already holds its maximum of {t} planes")
            self._grow(2 * t if self.max_size is None else min(2 * t, self.max_size))
        self._b[t] = b
        image = a if self._metric is None else self._metric(a)
        if point is not self._point or not self.sparse:
            self._point = None
        if self.sparse:
            plane = _plane(a, self._planes[-1][0] if self._planes else None)
            self._planes.append(plane)
            if self._point is not None:
                row = self.products(image)
                self._at_point = np.append(self._at_point, _dot(plane, point))
            elif point is None:
                row = self.products(image)
            else:
                # One pass over the planes: a plane is read once for both products.
                row, at_point = np.array([_dots(plane, image, point) for plane in self._planes]).reshape(-1, 2).T
                self._point, self._at_point = point, at_point.copy()
        else:
            self._A[t] = a
            row = self._A[:t + 1] @ image
        self._gram[t, :t + 1] = row
        self._gram[:t + 1, t] = row
        self._idle[t] = 0
        self.size = t + 1

    def _grow(self, capacity):
        t = self.size
        A, b, gram, idle = self._A, self._b, self._gram, self._idle
        if A is not None and len(A) < capacity:
            self._A = np.empty((capacity, A.shape[1]))
            self._A[:t] = A[:t]
        self._b = np.empty(capacity)
        self._b[:t] = b[:t]
        self._gram = np.empty((capacity, capacity))
        self._gram[:t, :t] = gram[:t, :t]
        self._idle = np.empty(capacity, dtype=np.int64)
        self._idle[:t] = idle[:t]

    def update_idle(self, alpha):
        """Count, per plane, the consecutive iterations its multiplier has been zero."""
        idle = self._idle[:self.size]
        idle[:] = np.where(alpha > 0, 0, idle + 1)

    def prune(self, idle_age, alpha):
        """Drop the planes idle for `idle_age` iterations or more; return the kept multipliers.

        Dropped planes have zero multipliers, so the subproblem's optimum, and
        the lower bound, are unchanged.
        """
        keep = self._idle[:self.size] < idle_age
        if keep.all():
            return alpha
        index = np.flatnonzero(keep)
        self._select(index, 0)
        return alpha[index]

    def room(self):
        """Return None if one more plane fits, else how many of the newest planes stay when it is made.

        With `max_size`, the newest ``max_size - 2``. With `max_bytes`, the
        newest planes that hold at most the budget less two dense planes (the
        aggregate of the others and the new plane take at most a dense
        plane's bytes each), so the budget holds after the aggregation.
        """
        keep = None
        if self.size == self.max_size:
            keep = self.max_size - 2
        if self.max_bytes is not None and self.nbytes + _DENSE_BYTES * self.dim > self.max_bytes:
            sizes = np.cumsum([_plane_bytes(plane) for plane in reversed(self._planes)])
            fits = int(np.searchsorted(sizes, self.max_bytes - 2 * _DENSE_BYTES * self.dim, side="right"))
            keep = fits if keep is None else min(keep, fits)
        return keep

    def make_room(self, alpha):
        """Make room for one more plane: if the bundle is full, aggregate all but the newest :meth:`room`.

        For max_size 2 this is Alg. 4 of paper 000: one aggregate and the new
        plane. Returns the multipliers of the planes left.
        """
        keep = self.room()
        return alpha if keep is None else self.aggregate_oldest(alpha, keep)

    def aggregate_oldest(self, alpha, keep):
        """Replace all planes but the newest `keep` by their aggregate; return the new multipliers.

        With the multipliers alpha of the last subproblem and I the oldest
        planes, the aggregate (paper 000, Sec. 3.1; Kiwiel 1983) is
        ``a_I = sum_{i in I} alpha_i a_i / alpha_I``, the same for b, with
        multiplier ``alpha_I = sum_{i in I} alpha_i``. Being a convex
        combination of planes it is a plane below R_emp, and the returned
        multipliers give the same dual value, so the subproblem's optimum and
        the lower bound are unchanged. If alpha_I is 0 the planes I are dropped
        (the same argument). The aggregate becomes the first plane. The Gram
        matrix follows from the old one, in O(t^2); the only O(d) work is
        forming a_I, in O(|I| d).

        Parameters
        ----------
        alpha : ndarray of shape (t,)
            The multipliers of the bundle's planes, >= 0.
        keep : int
            How many of the newest planes stay as they are, >= 0.

        Returns
        -------
        ndarray
            The multipliers of the planes left, aggregate first.
        """
        old = self.size - keep
        if old <= 0:
            return alpha
        total = float(np.sum(alpha[:old]))
        kept = np.arange(old, self.size)
        if total <= 0.0:
            self._select(kept, 0)
            return alpha[kept]
        weights = alpha[:old] / total
        gram = self._gram[:self.size, :self.size]
        cross = weights @ gram[:old]  # <a_I, a_j> for every plane j, in the Gram metric
        diagonal = float(cross[:old] @ weights)
        if self.sparse:
            a = _plane(_combine(weights, self._planes[:old], self.dim))
        else:
            a = weights @ self._A[:old]
        b = float(weights @ self._b[:old])
        self._select(kept, 1)
        if self.sparse:
            self._planes[0] = a
        else:
            self._A[0] = a
        if self._point is not None:
            self._at_point[0] = _dot(a, self._point)
        self._b[0] = b
        self._gram[0, 1:keep + 1] = cross[old:]
        self._gram[1:keep + 1, 0] = cross[old:]
        self._gram[0, 0] = diagonal
        self._idle[0] = 0
        return np.concatenate(([total], alpha[kept]))

    def state(self):
        """Return the planes, Gram matrix and idle counts as a dict of arrays (for a checkpoint), and
        ``rounding``, ``[radius, slack]``, for planes of rounded sums.

        Dense planes are ``A``; sparse ones (:attr:`sparse`) are the rows of a
        CSR matrix ``indptr, indices, values``, a dense plane among them with
        all `dim` indices, so that :meth:`restore` gives back the same storage.
        """
        state = {"b": self.b.copy(), "gram": self.gram.copy(), "idle": self._idle[:self.size].copy()}
        if self.slack > 0.0:  # planes of rounded sums: where they hold (radius, finite then)
            state["rounding"] = np.array([self.radius, self.slack])
        if not self.sparse:
            return dict(state, A=self.A.copy())
        every = np.arange(self.dim, dtype=_index_type(self.dim))
        indices = [every if index is None else index for index, _ in self._planes]
        indptr = np.zeros(self.size + 1, dtype=np.int64)
        np.cumsum([len(index) for index in indices], out=indptr[1:])
        return dict(state, indptr=indptr, indices=np.concatenate(indices or [every[:0]]),
                    values=np.concatenate([values for _, values in self._planes] or [np.zeros(0)]))

    def restore(self, state):
        """Replace the planes by those of :meth:`state` (either storage); the Gram matrix is taken as saved."""
        t = len(state["b"])
        if t > len(self._b):
            self._grow(t)
        if "A" in state:
            rows = np.asarray(state["A"], dtype=np.float64)
        else:
            indptr, indices, values = (np.asarray(state[key]) for key in ("indptr", "indices", "values"))
            rows = [(indices[start:end], values[start:end]) for start, end in zip(indptr[:-1], indptr[1:])]
        if self.sparse:
            self._planes = [_plane(row) if "A" in state else
                            (None if len(row[0]) == self.dim else row[0].astype(_index_type(self.dim)),
                             np.array(row[1], dtype=np.float64)) for row in rows]
        elif "A" in state:
            self._A[:t] = rows
        else:
            self._A[:t] = 0.0
            for target, (index, values) in zip(self._A, rows):
                target[index] = values
        self._b[:t] = state["b"]
        self.radius, self.slack = (float(x) for x in state.get("rounding", (math.inf, 0.0)))
        self._gram[:t, :t] = state["gram"]
        self._idle[:t] = state["idle"]
        self.size = t
        self._point = None

    def _select(self, index, start):
        """Move the planes `index` (increasing, ``index[k] >= start + k``) to rows ``start, start + 1, ...``;
        keep only those."""
        n = len(index)
        rows = slice(start, start + n)
        if self.sparse:
            self._planes = self._planes[:start] + [self._planes[i] for i in index]
        else:
            # In place, row by row in order (a row moves only towards the front, onto one already moved
            # or dropped); rows already in place stay: no copy of all the kept planes.
            for k, i in enumerate(index):
                if i != start + k:
                    self._A[start + k] = self._A[i]
        self._b[rows] = self._b[index]
        self._gram[rows, rows] = self._gram[np.ix_(index, index)]
        self._idle[rows] = self._idle[index]
        self.size = start + n
        if self._point is not None:
            self._at_point = np.concatenate((self._at_point[:start], self._at_point[index]))


def _index_type(dim):
    return np.int32 if dim <= np.iinfo(np.int32).max else np.int64


def _plane(a, last=None):
    """A sparse bundle's storage of the vector `a`: ``(indices, values)`` if under half of it is nonzero,
    else ``(None, a copy of a)``. The indices are the array `last` if equal to it."""
    count = np.count_nonzero(a)
    if 2 * count >= len(a):
        return None, np.array(a, dtype=np.float64)
    index, values = _mapped(count + 1, _index_type(len(a))), _mapped(count + 1, np.float64)
    fill_support(a, index, values)
    index, values = index[:count], values[:count]
    # The proximal method's planes of J all have w's support: sharing it saves a third of their bytes.
    if last is not None and np.array_equal(index, last):
        index = last
    return index, values


def _mapped(n, dtype):
    """``np.empty(n, dtype)``; from 1 MB up in pages of its own, which the system gets back when it is freed.

    Planes come and go (pruned, aggregated) in sizes that vary: from the
    heap, the holes they leave and the free memory the allocator keeps at
    its top would add tens of MB to the peak RSS at d = 2^22.
    """
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes < 2 ** 20:
        return np.empty(n, dtype=dtype)
    # The plane is written whole at once: its pages are mapped in one call (half the cost of a fault per page).
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype=dtype, count=n)


def _plane_bytes(plane):
    index, values = plane
    return values.nbytes + (0 if index is None else index.nbytes)


def _dot(plane, w):
    index, values = plane
    if index is None:
        return float(np.dot(values, w))
    # A compiled loop reads the plane once; w[index] would first copy the gathered values (5x slower).
    return sparse_dot(index, values, w)


def _dots(plane, x, y):
    """``(<plane, x>, <plane, y>)``, each bitwise :func:`_dot`."""
    index, values = plane
    if index is None:
        return float(np.dot(values, x)), float(np.dot(values, y))
    return sparse_dots(index, values, x, y)


def _groups(planes, dim, weights=None):
    """Yield `planes` (of a sparse bundle) as :data:`prbmrm.kernels.planes.GROUP`-tuples of indices and of
    values (a dense plane has no indices; the last group is padded with empty planes), with their `weights`."""
    empty = np.zeros(0, dtype=_index_type(dim)), np.zeros(0)
    for start in range(0, len(planes), GROUP):
        group = planes[start:start + GROUP]
        padded = [(empty[0] if index is None else index, values) for index, values in group]
        padded += [empty] * (GROUP - len(group))
        indices, values = zip(*padded)
        if weights is not None:
            group_weights = np.zeros(GROUP)
            group_weights[:len(group)] = weights[start:start + GROUP]
        yield indices, values, None if weights is None else group_weights


def _dot_planes(planes, w):
    """``[_dot(plane, w) for plane in planes]`` bitwise, the sparse planes a group at a time in one pass over `w`."""
    sparse = [plane for plane in planes if plane[0] is not None]
    products = np.empty(GROUP * -(-len(sparse) // GROUP))
    for start, (indices, values, _) in zip(range(0, len(sparse), GROUP), _groups(sparse, len(w))):
        sparse_dot_group(indices, values, w, products[start:start + GROUP])
    products = iter(products)
    return np.array([_dot(plane, w) if plane[0] is None else next(products) for plane in planes])


def _combine(alpha, planes, dim, out=None):
    """``sum_i alpha_i a_i`` over sparse-bundle `planes`, dense, summed plane by plane in order (into `out`)."""
    if out is None:
        total = np.zeros(dim)
    else:
        total = out
        total[:] = 0.0
    weights = np.asarray(alpha[:len(planes)], dtype=np.float64)
    for indices, values, group_weights in _groups(planes, dim, weights):
        scatter_add_group(indices, values, group_weights, total)
    return total


def planes_within(memory, dim):
    """Return how many planes of `dim` float64 values fit in `memory` bytes (at least 2).

    A memory budget for the bundle gives its ``bundle_size``: the oldest
    planes are then aggregated (paper 000, Sec. 3.1), which keeps the
    subproblem's optimum and the lower bound, so the budget costs iterations
    at most, never correctness. The Gram matrix (``8 t^2`` bytes) is small
    next to the planes for any budget that holds a plane of a large d.
    """
    return max(2, int(memory) // (8 * max(1, int(dim))))
