# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The global order of float64 scores over ranks: integer order keys, their sort, the split of keys into the
ranges of a sample sort, and the ROC area's passes before and after the sort.

A float64 value maps to an unsigned 64-bit key in the same order (-0.0 as
0.0, every NaN last, as numpy sorts): keys compare as integers and travel as
int64. :func:`sorted_order` sorts them with numpy's vectorised sort of
uint64, each key carrying its index in its low bits, and sorts again the few
runs that leaves out of order. Measured on 2.5M keys (2 cores, loaded): 37 ns
per key, against 151 for ``np.argsort`` of the float64 values (which then
needs its ties put in order), about 110 for a least-significant-digit radix
sort of (key, index) pairs (six passes through memory) and 790 for
``np.argsort(kind="stable")``.
"""

from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

import numpy as np

cdef uint64_t _SIGN = (<uint64_t>1) << 63
cdef uint64_t _ALL = ~(<uint64_t>0)


cdef inline uint64_t _key(double value) noexcept nogil:
    cdef uint64_t bits
    if value != value:
        return _ALL              # NaN: after every number
    if value == 0.0:
        return _SIGN             # -0.0 and 0.0 are equal
    memcpy(&bits, &value, 8)
    # Negative: every bit flipped; else the sign bit set (a mask, not a branch: signs come at random).
    return bits ^ ((<uint64_t>0 - (bits >> 63)) | _SIGN)


def order_keys(const double[::1] values, uint64_t[::1] out):
    """Write into `out` the order key of each of `values`: ``key(a) < key(b)`` exactly when ``a < b``.

    -0.0 and 0.0 get the same key; every NaN gets the largest key (numpy's
    sorts also put NaN last). :func:`order_values` maps keys back.
    """
    cdef Py_ssize_t n = values.shape[0], i
    if out.shape[0] != n:
        raise ValueError("one key per value")
    with nogil:
        for i in range(n):
            out[i] = _key(values[i])


def order_values(const uint64_t[:] keys, double[::1] out):
    """Write into `out` the float64 value of each order key (the inverse of :func:`order_keys`, which maps
    -0.0 to 0.0 and NaN to one NaN)."""
    cdef Py_ssize_t n = keys.shape[0], i
    cdef uint64_t bits
    if out.shape[0] != n:
        raise ValueError("one value per key")
    with nogil:
        for i in range(n):
            bits = keys[i] ^ (_SIGN if keys[i] >> 63 else _ALL)
            memcpy(&out[i], &bits, 8)


def _index_bits(Py_ssize_t n):
    """The number of low bits that hold an index below `n` in a packed key (at least 1)."""
    return max(1, (n - 1).bit_length())


def _pack_keys(const uint64_t[:] keys, uint64_t[::1] out):
    """Write into `out` each key with its low :func:`_index_bits` bits replaced by its index."""
    cdef Py_ssize_t n = keys.shape[0], i
    cdef int bits = _index_bits(n)
    cdef uint64_t high = _ALL << bits
    if out.shape[0] != n:
        raise ValueError("one packed key per key")
    with nogil:
        for i in range(n):
            out[i] = (keys[i] & high) | <uint64_t>i


def _unpack_order(const uint64_t[::1] packed, const uint64_t[:] keys, const int64_t[:] tags,
                  Py_ssize_t[::1] out, Py_ssize_t[::1] unsettled):
    """Read the order out of the sorted packed keys, and list the positions of the runs it leaves out of order.

    A run of packed keys with the same high bits is in index order; it is
    settled when its keys (then tags, or else indices) ascend. The positions
    of every run that is not are written to the start of `unsettled`, in
    ascending order. Returns their number.
    """
    cdef Py_ssize_t n = packed.shape[0], k, start = 0, a, b, marked = 0
    cdef int bits = _index_bits(n)
    cdef uint64_t low = ~(_ALL << bits)
    cdef bint has_tags = tags is not None, marking = False
    if keys.shape[0] != n or out.shape[0] != n or unsettled.shape[0] != n or (has_tags and tags.shape[0] != n):
        raise ValueError("the arrays of unpack_order do not agree")
    with nogil:
        for k in range(n):
            out[k] = <Py_ssize_t>(packed[k] & low)
            if k == 0 or (packed[k] >> bits) != (packed[k - 1] >> bits):
                start, marking = k, False
            elif not marking:
                a, b = out[k - 1], out[k]
                if keys[a] > keys[b] or (has_tags and keys[a] == keys[b] and tags[a] > tags[b]):
                    marking = True
                    for a in range(start, k):
                        unsettled[marked] = a
                        marked += 1
            if marking:
                unsettled[marked] = k
                marked += 1
    return marked


class Workspace:
    """Arrays kept from one call to the next, by name: a call writes into the memory of the last call's array
    of that name, grown (by 1/8 more than asked, as the sizes of a sample sort's ranges vary a little from
    one call to the next) only when too small.

    An evaluation of the ROC area on 1M keys a rank took 55-62 ms CPU with fresh arrays and 41-49 ms with
    kept ones (2 ranks, loaded machine): the first touch of a fresh page costs about as much as the sort. An
    array handed out is valid until the next request of its name.
    """

    def __init__(self):
        self._arrays = {}

    def nested(self, name):
        """Return the workspace kept as `name` inside this one (for a second sort alive beside the first)."""
        kept = self._arrays.get(name)
        if not isinstance(kept, Workspace):
            kept = self._arrays[name] = Workspace()
        return kept

    def array(self, name, shape, dtype):
        """Return a contiguous array of this shape and dtype (uninitialized) in the memory kept as `name`."""
        dtype = np.dtype(dtype)
        shape = tuple(shape) if isinstance(shape, tuple) else (shape,)
        size = int(np.prod(shape, dtype=np.int64))
        kept = self._arrays.get(name)
        if not isinstance(kept, np.ndarray) or kept.dtype != dtype or kept.size < size:
            self._arrays.pop(name, None)  # the old array goes before the new one is made
            kept = self._arrays[name] = np.empty(size + size // 8, dtype=dtype)
        return kept[:size].reshape(shape)


def sorted_order(keys, tags=None, work=None):
    """Return the permutation that sorts `keys` stably, or equal keys by `tags`: ``keys[order]`` ascends.

    numpy's vectorised sort of the keys, each with its index in its low
    bits (:func:`_pack_keys`), orders them by their high bits and then by
    index; a run of keys whose high bits agree but which are out of order
    (keys that differ only in the low bits, or ties whose tags do not
    ascend) is sorted again by numpy's lexsort of (key, tag or index).
    Typical keys leave few such runs; every key equal costs one lexsort of
    them all with tags (none without).

    Parameters
    ----------
    keys : ndarray of uint64, shape (n,)
        Order keys (:func:`order_keys`); any stride.
    tags : ndarray of int64, shape (n,), optional
        The order of equal keys (distinct values); by default the index.
    work : Workspace, optional
        Where the arrays of the sort are kept (the result too: valid until the next call with `work`).

    Returns
    -------
    ndarray of intp, shape (n,)
    """
    n = keys.shape[0]
    work = Workspace() if work is None else work
    packed = work.array("sort packed", n, np.uint64)
    _pack_keys(keys, packed)
    packed.sort()
    order = work.array("sort order", n, np.intp)
    unsettled = work.array("sort unsettled", n, np.intp)
    marked = _unpack_order(packed, keys, tags, order, unsettled)
    if marked:
        where = unsettled[:marked]
        members = order[where]
        # Across runs the high bits ascend: one lexsort of every unsettled key sorts each run in place.
        order[where] = members[np.lexsort((members if tags is None else tags[members], keys[members]))]
    return order


cdef inline bint _below(uint64_t key, int64_t tag, uint64_t split_key, int64_t split_tag) noexcept nogil:
    """Whether the splitter (split_key, split_tag) is at or below (key, tag)."""
    # Bitwise operators, not `or`/`and`: no branch on the key.
    return (split_key < key) | ((split_key == key) & (split_tag <= tag))


cdef inline Py_ssize_t _range_of(uint64_t key, int64_t tag, const uint64_t* split_keys, const int64_t* split_tags,
                                 Py_ssize_t splits) noexcept nogil:
    """The number of the `splits` splitters at or below (key, tag): a binary search whose steps do not depend on
    the key (the ranges of scores come at random, and a branch on them is mispredicted half the time)."""
    cdef Py_ssize_t lo = 0, length = splits + 1, half
    while length > 1:
        half = length >> 1
        lo += half * _below(key, tag, split_keys[lo + half - 1], split_tags[lo + half - 1])
        length -= half
    return lo


def split_ranges(const uint64_t[::1] keys, const int64_t[::1] payload, const int64_t[::1] tags, int64_t first,
                 const uint64_t[::1] split_keys, const int64_t[::1] split_tags, int64_t[:, ::1] rows,
                 Py_ssize_t[::1] local, int64_t[::1] counts):
    """Lay out the keys by range of a sample sort: the rows for range 0, then for range 1, ...

    The range of key i is the number of splitters at or below (key i, tag
    i) (the tag is the key's global position ``first + i`` when `tags` is
    None), found by a binary search of the sorted splitters. Within a range
    the keys keep their order.

    Parameters
    ----------
    keys, payload, tags : arrays of n
        Order keys, their payloads and their tags (or None).
    first : int
        The global position of key 0 (the ties' order without tags).
    split_keys, split_tags : arrays of P - 1
        The splitters, in increasing (key, tag) order.
    rows : int64 array of shape (n, 2), or (n, 3) with tags
        Written: each key's bits, payload (and tag), range by range.
    local : intp array of n
        Written: the index of the key of each row.
    counts : int64 array of P
        Written: the number of keys of each range.
    """
    cdef Py_ssize_t n = keys.shape[0], splits = split_keys.shape[0], width = rows.shape[1], i, p, at
    cdef bint has_tags = tags is not None
    if (payload.shape[0] != n or (has_tags and tags.shape[0] != n) or split_tags.shape[0] != splits
            or rows.shape[0] != n or width != 2 + has_tags or local.shape[0] != n
            or counts.shape[0] != splits + 1):
        raise ValueError("the arrays of split_ranges do not agree")
    if n == 0:
        counts[:] = 0
        return
    # Raw pointers, the next row of each range in memory of its own (the compiler then knows a row written does
    # not move it) and one loop per row width: 6.0 ms per 1M keys on 2 ranges against 10.8 through memoryviews
    # (loaded machine).
    cdef const uint64_t* key = &keys[0]
    cdef const int64_t* pay = &payload[0]
    cdef const int64_t* tag = &tags[0] if has_tags else NULL
    cdef const uint64_t* split_key = &split_keys[0] if splits else NULL
    cdef const int64_t* split_tag = &split_tags[0] if splits else NULL
    cdef int64_t* row = &rows[0, 0]
    cdef Py_ssize_t* where = &local[0]
    cdef Py_ssize_t* next_row = <Py_ssize_t*>calloc(splits + 1, sizeof(Py_ssize_t))
    if next_row == NULL:
        raise MemoryError()
    with nogil:
        # Two passes, each finding the ranges anew (a search costs less than an array of them).
        for i in range(n):
            next_row[_range_of(key[i], tag[i] if has_tags else first + i, split_key, split_tag, splits)] += 1
        at = 0
        for p in range(splits + 1):
            counts[p] = next_row[p]
            next_row[p], at = at, at + next_row[p]
        if has_tags:
            for i in range(n):
                p = _range_of(key[i], tag[i], split_key, split_tag, splits)
                at = next_row[p]
                next_row[p] = at + 1
                row[3 * at] = <int64_t>key[i]
                row[3 * at + 1] = pay[i]
                row[3 * at + 2] = tag[i]
                where[at] = i
        else:
            for i in range(n):
                p = _range_of(key[i], first + i, split_key, split_tag, splits)
                at = next_row[p]
                next_row[p] = at + 1
                row[2 * at] = <int64_t>key[i]
                row[2 * at + 1] = pay[i]
                where[at] = i
    free(next_row)


def roc_keys(const double[::1] f, const double[::1] y, double[::1] c, uint64_t[::1] keys, int64_t[::1] positive):
    """The values the ROC area sorts (paper 000, Alg. 7), in one pass.

    Writes ``c = f - y'/2`` (y' = +1 where ``y > 0``, else -1), the order
    key of each c (:func:`order_keys`) and the class (1 positive, 0 negative).
    Returns the number of positive examples.
    """
    cdef Py_ssize_t n = f.shape[0], i, positives = 0
    cdef int64_t p
    if y.shape[0] != n or c.shape[0] != n or keys.shape[0] != n or positive.shape[0] != n:
        raise ValueError("one label, value, key and class per score")
    with nogil:
        for i in range(n):
            # Arithmetic on the class, no branch: classes come at random. p - 0.5 is exactly +-0.5.
            p = y[i] > 0
            c[i] = f[i] - (<double>p - 0.5)
            positive[i] = p
            positives += p
            keys[i] = _key(c[i])
    return positives


def roc_weights(const signed char[::1] positive, const Py_ssize_t[::1] order, int64_t positives_before,
                int64_t before, int64_t negatives, double[::1] out):
    """The ROC area's weights (paper 000, Alg. 7) of a range of the global order, in one pass.

    A negative example gets the number of positives before it, a positive
    one minus the number of negatives after it.

    Parameters
    ----------
    positive : int8 array of n
        1 for a positive example, 0 for a negative one (one byte each: read in the random order of `order`,
        they stay in cache).
    order : intp array of n
        The examples in global order (:func:`radix_order`).
    positives_before, before : int
        The numbers of positive examples, and of all examples, in the lower ranges.
    negatives : int
        The number of negative examples over all ranges.
    out : float64 array of n
        Written: the weight of each example, at its index (integers, exact below 2^53).
    """
    cdef Py_ssize_t n = order.shape[0], k, i
    cdef int64_t positives = positives_before, p
    if positive.shape[0] != n or out.shape[0] != n:
        raise ValueError("one label and one weight per example")
    with nogil:
        for k in range(n):
            i = order[k]
            p = positive[i]
            # A positive: before + k examples precede it, positives of them; the other negatives come
            # after. A negative: the positives so far. Arithmetic, not a branch on the class.
            out[i] = <double>(positives + p * (before + k - 2 * positives - negatives))
            positives += p
