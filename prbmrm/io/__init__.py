"""Data in and out: input readers, the shard format, and the distributed loader, one module per job.

:mod:`prbmrm.io.readers`
    SVMlight/LIBSVM text (optionally compressed), ``.npz`` and CSV files into arrays.
:mod:`prbmrm.io.shards`
    The HDF5 shard format (documented there): write, list and validate shard
    sets; :func:`register_layout` is the hook through which a package adds a
    layout of its own (:mod:`prbmrm.structured.data`).
:mod:`prbmrm.io.loader`
    Which rank reads which rows: :func:`load_local` (shard files) and
    :func:`split_local` (arrays in memory) give each rank its
    :class:`LocalData`, in canonical blocks that keep results bitwise equal on
    any number of ranks.
:mod:`prbmrm.io.arrays`
    The checks and conversions the three share (finiteness, label kinds,
    balanced blocks of rows).

Imports: numpy, scipy, h5py, scikit-learn (the SVMlight parser), and of
prbmrm only :mod:`prbmrm.errors`, :mod:`prbmrm.io.files` and :mod:`prbmrm.plugins`;
never a solver, a loss or MPI (the loader is handed a communicator).
"""

from .arrays import (LABEL_KINDS, STRUCTURED, check_finite, infer_label_kind, negative_label,
                     row_bounds)
from .loader import DENSE_DENSITY, LocalData, collectively, load_local, rank_blocks, split_local
from .readers import read_input
from .shards import (FORMAT, FORMAT_VERSION, LAYOUTS, list_shards, open_shard, parts_count,
                     register_layout, shard_attrs, write_all, write_shards)

__all__ = ["DENSE_DENSITY", "FORMAT", "FORMAT_VERSION", "LABEL_KINDS", "LAYOUTS", "STRUCTURED", "LocalData",
           "check_finite", "collectively", "infer_label_kind", "list_shards", "load_local", "negative_label",
           "open_shard", "parts_count", "rank_blocks", "read_input", "register_layout", "row_bounds",
           "shard_attrs", "split_local", "write_all", "write_shards"]
