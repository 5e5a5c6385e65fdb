"""Exact sums of float64 partial sums over ranks: fixed-point integer limbs, one Allreduce.

Floating-point addition is not associative, so a plain Allreduce of float64
gives results that depend on how rows were split over ranks and on the order
in which MPI reduces; BMRM amplifies such round-off from iteration to
iteration. Here every partial sum of a canonical block of rows (a float64
vector computed in a fixed order, whichever rank holds the block) is rounded
once onto a per-component fixed-point grid common to all ranks and split into
two int64 limbs; the limbs are added as integers (``MPI.SUM`` on int64, exact
and associative), together with a few status words (an error count, an overflow
count, stop requests). The result is a function of the multiset of
block partials alone: bitwise the same on any number of ranks, for any
reduction order or algorithm MPI picks.

The grid of component j is ``u_j = 2^(e_j - 2 W)``, where ``2^(e_j)`` is a
bound on every |partial_j| agreed by all ranks and ``W = 61 - ceil(log2(n_parts + 1))``
bits per limb (so the sums of ``n_parts`` limbs cannot wrap). The bound comes
from the earlier evaluations (it only grows): a rank whose partial reaches it
raises the overflow count, and then, rarely (the first evaluation, and when a
partial grows beyond ``2^MARGIN_BITS`` times the largest so far), every rank
agrees on the new largest partial (one Allreduce-max) and the limbs go again
(one more Allreduce). The bounds are part of the run's state: a checkpoint
keeps them (:data:`prbmrm.checkpoint.SUM_BOUNDS`), so a resumed run rounds as
the uninterrupted one did, on any number of ranks. A sum is thus a function of
the partials and of the bounds agreed so far: the same partials after another
history of sums (say, a fresh oracle) may differ in the last bit; the history
is the same on every rank count.

Precision: per component, ``|sum - exact sum of the partials| <= n_parts u_j + 2 ulp(sum)`` with
``u_j <= 2^(MARGIN_BITS + 1 - 2 W) max(M_j, 2^-SPAN_BITS M)``, where M_j is the largest |partial_j|
seen so far and M the largest over all components. For 256 blocks (W = 52) the first term is at most
``2^-91 max(M_j, 2^-40 M)``; a float64 sum of the same partials in any order errs by up to
``n_parts 2^-53`` times the sum of their magnitudes. So the exact sum adds far less error than the
rounding of the block partials themselves, and the planes ``R(w_t) + <a_t, w - w_t>`` that BMRM's lower
bound rests on are as valid as the float64 risk and subgradient make them (they were formed from a
float64 sum before).

One limb (:meth:`FixedPointSum.set_limbs`, half the bytes; BMRM asks for it where it can account for the
rounding, :mod:`prbmrm.solvers.bmrm`): component j is rounded to the grid ``u_j = 2^(e_j - W)``, each
partial to the nearest multiple (error at most ``u_j / 2``), the integers are summed exactly and the sum
``Q_j u_j`` converted to float64 once (``Q_j`` below 2^62: one rounding, at most ``2^-53 |sum|``, or
``2^-1075`` where the result is subnormal). So, per component,
``|sum - exact sum of the partials| <= n_parts u_j / 2 + 2^-53 |sum| + 2^-1075``, which
:meth:`FixedPointSum.error_bound` returns (rounded up) and ``tests/distributed/test_exact.py`` checks against
``math.fsum``; ``u_j <= 2^(MARGIN_BITS + 1 - W) max(M_j, 2^-SPAN_BITS M)``, i.e. for 256 blocks about 2^-47 of
the largest partial, a few float64 roundings of it. The sum is still a function of the partials and the
bounds alone: bitwise the same on any number of ranks.

Imports: numpy; of prbmrm: :mod:`prbmrm.kernels.fixed`.
"""

import math

import numpy as np

from ..kernels.fixed import column_max_abs, fixed_point_limbs, fixed_point_sums

MARGIN_BITS = 4
"""A new bound is this many bits above the largest partial, so that growing sums rarely overflow it."""

SPAN_BITS = 40
"""No component's bound is set more than this many bits below the largest bound: a component whose
partials were all zero so far gets room without a retry."""

STOP_SIGNALS = (2, 15, 10)
"""The signals that ask a run to stop (SIGINT, SIGTERM, SIGUSR1): each has a status word, the count of the
ranks that caught it (a sum, unlike a signal number, survives the Allreduce)."""

FAILED, OVERFLOW = 0, 1
STATUS_WORDS = 2 + len(STOP_SIGNALS)
"""Status words after the limbs: ranks that failed, ranks whose partials overflowed the bounds, then per
signal of :data:`STOP_SIGNALS` the ranks that caught it."""


CHUNK = 2 ** 16
"""Components encoded, measured or decoded at a time: the temporaries stay a few MB at any n (d in the
millions), and each component's arithmetic is the same whatever the chunks."""


def chunks(n):
    """Slices of at most :data:`CHUNK` of ``range(n)``, in order."""
    return [slice(start, min(start + CHUNK, n)) for start in range(0, n, CHUNK)]


def _column_largest(partials):
    """The largest |partial| of each column of the 2-d `partials` (0 for none; NaN if one is NaN)."""
    largest = np.empty(partials.shape[1])
    column_max_abs(partials, largest)
    return largest


class _ColumnLargest:
    """The largest |partial| per column of dense `partials` (NaN as inf), measured when indexed with a slice."""

    def __init__(self, partials):
        self.partials = partials

    def __getitem__(self, part):
        largest = _column_largest(self.partials[:, part])
        np.copyto(largest, np.inf, where=np.isnan(largest))
        return largest

    def __array__(self, dtype=None, copy=None):
        whole = np.concatenate([self[part] for part in chunks(self.partials.shape[1])])
        return whole if dtype is None else whole.astype(dtype)


def _rows(partials):
    """(index, row) per block of rows kept on their supports."""
    return zip(partials.index, partials.values)


class FixedPointSum:
    """The fixed-point state of one kind of sum (a length and the agreed bounds), the same on every rank.

    Parameters
    ----------
    n : int
        Length of each partial sum.
    n_parts : int
        Number of partial sums over all ranks (bounds the integer sums).
    remember : bool
        Keep the bounds from sum to sum (one Allreduce per sum, the bounds a
        state that a checkpoint must keep); False agrees on them afresh for
        every sum (an Allreduce-max first: two per sum, no state).
    limbs : {2, 1}
        Integer words per component (:meth:`set_limbs`).

    Attributes
    ----------
    n, n_parts, limbs : int
        As given.
    buffer : ndarray of int64, shape (limbs n + STATUS_WORDS,)
        What travels: the high limbs, the low limbs (two limbs), the status words.
    exponent : ndarray of int16, shape (n,)
        log2 of the agreed bound per component (None before the first sum); int16 holds every bound
        (+-:attr:`EXPONENT_LIMIT`) in a quarter of int64's bytes, which count at d in the millions.
    retries : int
        Sums that needed a new bound (the rare second Allreduce).
    """

    EXPONENT_LIMIT = 1100
    """No bound is beyond 2^+-1100 (float64 spans 2^-1074 to 2^1024): what a stored bound may be."""

    EXPONENT_DTYPE = np.int16
    """The type of :attr:`exponent`: it holds +-EXPONENT_LIMIT, and the grid exponents (+-2 bits more)."""

    def __init__(self, n, n_parts, remember=True, limbs=2):
        self.n, self.n_parts = int(n), int(n_parts)
        self.remember = bool(remember)
        self.bits = 62 - math.ceil(math.log2(int(n_parts) + 1)) - 1
        self.exponent = None
        self.retries = 0
        self._largest = self._unmeasured = None
        self.set_limbs(limbs)

    def set_limbs(self, limbs):
        """Sum with `limbs` (2 or 1) int64 words per component from the next sum on; the bounds stay.

        Two limbs add nothing to the partials' own rounding (module docstring); one limb moves half the
        bytes and errs by at most :meth:`error_bound`.
        """
        if limbs not in (1, 2):
            raise ValueError(f"a fixed-point sum has 1 or 2 limbs, not {limbs!r}")
        self.limbs = int(limbs)
        self.buffer = np.zeros(self.limbs * self.n + STATUS_WORDS, dtype=np.int64)

    @property
    def status(self):
        """ndarray of int64: the status words (a view into :attr:`buffer`)."""
        return self.buffer[self.limbs * self.n:]

    def error_bound(self, sums, part=slice(None)):
        """Return, per component, a bound on ``|sums - exact sum of the partials|`` for the `sums` just decoded.

        One limb: ``n_parts u_j / 2 + 2^-53 |sums_j| + 2^-1075`` (module docstring), rounded up (each term
        computed with at most a few float64 roundings, covered by the factor ``1 + 2^-40``), for the
        components `part` (a slice; all by default). Two limbs: zero beyond the partials' own rounding is
        claimed (module docstring); returns None.
        """
        if self.limbs == 2:
            return None
        grid = np.ldexp(0.5 * self.n_parts, self.exponent[part] - self.bits)
        return (grid + np.ldexp(np.abs(sums[part]), -53) + 2.0 ** -1074) * (1.0 + 2.0 ** -40)

    def encode(self, partials, failed=False, signal=None, out=None):
        """Fill :attr:`buffer` with this rank's limbs of `partials` and its status.

        Parameters
        ----------
        partials : ndarray of shape (k, n), or an object with ``index`` and ``values`` lists
            (:class:`prbmrm.distributed.comm.SupportRows`): one row per block held here.
        failed : bool
            This rank failed computing them (its limbs are then zero).
        signal : int or None
            A signal this rank caught (one of :data:`STOP_SIGNALS` is counted).
        out : ndarray of shape (n,), optional
            Dense `partials` only, for a rank alone (whose Allreduce would return its limbs as they are):
            each chunk's limbs are decoded into `out` as soon as they are made, and the limbs of
            :attr:`buffer` are left untouched (its zero pages then take no memory); the status is set as
            usual. `out` holds the sum if neither failure nor overflow is reported.
        """
        limbs = self.buffer[:self.limbs * self.n].reshape(self.limbs, self.n)
        if out is None:
            limbs[:] = 0
        overflow = False
        if not failed:
            dense = not hasattr(partials, "index")
            if dense:
                # Checked a chunk at a time as the limbs are made; all n largest partials are measured only
                # if asked (a rescale).
                partials = np.atleast_2d(partials)
                self._largest, self._unmeasured = None, partials
                overflow = self.exponent is None
                for part in [] if overflow else chunks(self.n):
                    sums = self._split(partials[:, part], self.exponent[part], check=True)
                    if sums is None:
                        overflow = True
                        if out is None:  # the chunks' limbs made so far go
                            limbs[:] = 0
                        break
                    if out is None:
                        limbs[:, part] = sums
                    else:
                        self._decode(sums, self.exponent[part], out[part])
            else:
                self.measure(partials)
                overflow = self.exponent is None or any(
                    self._reaches(self._largest[part], self.exponent[part]) for part in chunks(self.n))
            if not overflow and not dense:
                for index, row in _rows(partials):
                    for part in chunks(len(index)):
                        limbs[:, index[part]] += self._split(row[part], self.exponent[index[part]])
        status = self.status
        status[:] = 0
        status[FAILED], status[OVERFLOW] = int(bool(failed)), int(overflow)
        if signal in STOP_SIGNALS:
            status[2 + STOP_SIGNALS.index(signal)] = 1

    @staticmethod
    def _reaches(largest, exponent):
        """Whether some components, whose largest |partial| is `largest`, reach their bound 2^`exponent`."""
        # NaN compares false (measure makes it inf): ask for the finite check too.
        return not np.all(np.isfinite(largest)) or bool(np.any(largest >= np.ldexp(1.0, exponent)))

    def measure(self, partials):
        """Set :attr:`largest` to this rank's largest |partial| per component."""
        if self._largest is None:
            self._largest = np.zeros(self.n)
        self._largest[:] = 0.0
        self._unmeasured = None
        if not hasattr(partials, "index"):  # all blocks in one compiled pass a chunk
            for part in chunks(self.n):
                self._largest[part] = _column_largest(partials[:, part])
        else:
            for index, row in _rows(partials):
                np.maximum.at(self._largest, index, np.abs(row))
        np.copyto(self._largest, np.inf, where=np.isnan(self._largest))

    def signal(self):
        """The stop signal some rank caught, from the reduced status words (None: none)."""
        for i, signum in enumerate(STOP_SIGNALS):
            if self.status[2 + i]:
                return signum
        return None

    def _split(self, partials, exponent, check=False):
        """The sums over rows of the limbs of `partials` (one row, or rows of blocks): two on the grid
        2^(exponent - 2 bits), per row and component |high| <= 2^bits, 0 <= low <= 2^bits; one on the grid
        2^(exponent - bits), |limb| <= 2^bits. With `check`, None if some |partial| reaches its bound
        2^exponent or is not finite (without, the bounds must be known to cover them).

        Each step is exact or a deterministic rounding (a product by a power of two, floor, the
        difference of two floats that share their leading bits, rint): the same bits on every rank.
        `partials` is one chunk (:data:`CHUNK` columns, of one or more rows), so temporaries stay small
        however long the sums; two limbs in one compiled pass over its rows
        (:func:`prbmrm.kernels.fixed.fixed_point_limbs`)."""
        rows = np.atleast_2d(partials)
        if self.limbs == 1:  # each partial rounded once to the nearest multiple of the grid
            if check and self._reaches(_column_largest(rows), exponent):
                return None
            return (np.rint(rows * np.ldexp(1.0, self.bits - exponent)).astype(np.int64).sum(axis=0),)
        high, low = np.empty(rows.shape[1], dtype=np.int64), np.empty(rows.shape[1], dtype=np.int64)
        # the kernel checks the bounds as it goes (two limbs fit any partial below its bound)
        fits = fixed_point_limbs(rows, np.ldexp(1.0, 2 * self.bits - exponent), self.bits, high, low)
        return (high, low) if fits or not check else None

    def rescale(self, largest):
        """Raise the bounds to cover `largest` (the Allreduce-max of every rank's :attr:`largest`).

        Returns
        -------
        bool
            False if some partial is not finite: no bound covers it.
        """
        if not all(np.all(np.isfinite(largest[part])) for part in chunks(self.n)):
            return False

        def wanted(part):
            return np.frexp(largest[part])[1].astype(np.int64) + MARGIN_BITS

        floor = max([wanted(part).max(initial=0) for part in chunks(self.n)], default=0) - SPAN_BITS
        # In place where the bounds only grow (no second array of n bounds while the first is held).
        grow = self.exponent is not None and self.remember
        exponent = self.exponent if grow else np.empty(self.n, dtype=self.EXPONENT_DTYPE)
        for part in chunks(self.n):
            if grow:
                np.maximum(exponent[part], np.maximum(wanted(part), floor), out=exponent[part])
            else:
                np.maximum(wanted(part), floor, out=exponent[part])
        self.exponent = exponent
        self.retries += 1
        return True

    @property
    def largest(self):
        """ndarray: this rank's largest |partial| per component in the last :meth:`encode` (NaN as inf); the
        state's own array, valid until the next :meth:`encode`. For dense partials, an object that measures
        the components it is indexed with (``np.asarray`` measures all): a rescale on one rank reads it a chunk
        at a time."""
        return self._largest if self._unmeasured is None else _ColumnLargest(self._unmeasured)

    def decode(self, out=None):
        """The float64 sums from the reduced limbs of :attr:`buffer`, a chunk of :data:`CHUNK` components at a time.

        Parameters
        ----------
        out : ndarray of shape (n,), optional
            Where to write them (else a new array).

        Returns
        -------
        ndarray of shape (n,)
        """
        out = np.empty(self.n) if out is None else out
        limbs = self.buffer[:self.limbs * self.n].reshape(self.limbs, self.n)
        if self.limbs == 2:  # one compiled pass, no temporaries
            fixed_point_sums(limbs[0], limbs[1], self.exponent, self.bits, out)
            return out
        for part in chunks(self.n):
            self._decode([limbs[0, part]], self.exponent[part], out[part])
        return out

    def _decode(self, sums, exponent, out):
        """Write into `out` the float64 sums of the limb sums `sums` (one or two arrays) on the grids of
        `exponent`."""
        if self.limbs == 1:
            np.ldexp(sums[0].astype(np.float64), exponent - self.bits, out=out)
            return
        fixed_point_sums(*sums, exponent, self.bits, out)
