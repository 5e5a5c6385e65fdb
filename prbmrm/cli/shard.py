"""Convert SVMlight/LIBSVM, .npz or .csv input into HDF5 shard files.

Usage::

    python -m prbmrm.cli.shard INPUT [INPUT ...] --parts P --out DIR
        [--multilabel] [--n-features D] [--positive LABEL] [--dense | --sparse]
        [--label-column K] [--float32] [--overwrite] [--quiet]

``.npz`` inputs with the arrays ``x_values``, ``x_offsets``, ``y_values``,
``y_offsets`` hold structured examples (sequences, point sets): they are
written as ragged shards that never split an example
(:mod:`prbmrm.structured.data`).

Runs on one process. Several inputs are concatenated. The rows are cut into
P contiguous blocks balanced by nonzeros, never inside a query, and written
as ``DIR/part-00000.h5`` ... (see :mod:`prbmrm.io.shards` for the format). On any
error it prints one line ``prbmrm.cli.shard: error: ...`` to stderr, leaves no
partial output and exits with status 2.

Imports: of prbmrm: :mod:`prbmrm.cli.common`, :mod:`prbmrm.distributed.comm`, :mod:`prbmrm.errors`, :mod:`prbmrm.io`,
:mod:`prbmrm.io.shards`, :mod:`prbmrm.structured`, :mod:`prbmrm.structured.data`.
"""

import os
import sys
from argparse import ArgumentTypeError

from .common import EXIT_INPUT, ArgumentParser, program
from .config import parse_arguments
from ..io import read_input, write_shards
from ..io.shards import shard_summary
from ..distributed.comm import launched_size
from ..errors import InputError, PrbmrmError, UsageError
from ..structured import RaggedExamples
from ..structured import data as structured_data

PROG = "prbmrm.cli.shard"


def build_parser():
    """Return the argument parser of ``python -m prbmrm.cli.shard``.

    Returns
    -------
    argparse.ArgumentParser
    """
    p = ArgumentParser(
        prog=PROG,
        description="Convert SVMlight/LIBSVM (also .gz/.bz2/.xz), .npz or .csv input "
                    "into P HDF5 shard files balanced by nonzeros, one or more per MPI "
                    "rank. Queries (qid:) are never split across shards.")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="input file(s); several are concatenated in order")
    p.add_argument("--parts", "-p", type=int, required=True, metavar="P",
                   help="number of shard files (at least the number of MPI ranks to use)")
    p.add_argument("--out", "-o", required=True, metavar="DIR",
                   help="output directory (created if needed)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--multilabel", action="store_true",
                      help="labels are comma-separated label sets")
    kind.add_argument("--multioutput", action="store_true",
                      help="a 2-D 'y' (.npz) holds real targets even if it is all 0/1 "
                           "(implied when it holds other values, or several CSV label columns)")
    p.add_argument("--n-features", type=int, metavar="D",
                   help="number of features (default: the largest feature index)")
    p.add_argument("--positive", type=float, metavar="LABEL",
                   help="one-vs-rest: map LABEL to +1 and every other label to -1")
    layout = p.add_mutually_exclusive_group()
    layout.add_argument("--dense", dest="dense", action="store_const", const=True,
                        help="store X dense (default for dense .npz and CSV input)")
    layout.add_argument("--sparse", dest="dense", action="store_const", const=False,
                        help="store X as CSR (default for SVMlight input)")
    add_label_column_option(p)
    p.add_argument("--float32", action="store_true",
                   help="store the feature values as float32 (half the bytes; training computes in float64)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing part-*.h5 files in DIR")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    return p


def add_label_column_option(parser):
    """Add ``--label-column`` (CSV input) to `parser`: shared by shard, train and predict."""
    parser.add_argument("--label-column", type=_columns, default=0, metavar="K[,K...]",
                        help="column of the label in CSV input, a number from 0 (default 0; -1 for the "
                             "last) or a name of the header line; several comma-separated columns are "
                             "multioutput targets. The header and the label column are reported")


def _columns(text):
    columns = [c.strip() for c in text.split(",")]
    if not all(columns):
        raise ArgumentTypeError(f"expected column numbers or names separated by commas, got {text!r}")
    return _int_or_name(columns[0]) if len(columns) == 1 else [_int_or_name(c) for c in columns]


def _int_or_name(text):
    try:
        return int(text)
    except ValueError:
        return text


def _check_options(args):
    if args.parts < 1:
        raise UsageError(f"--parts must be at least 1, got {args.parts}")
    if args.n_features is not None and args.n_features < 1:
        raise UsageError(f"--n-features must be at least 1, got {args.n_features}")
    if (args.multilabel or args.multioutput) and args.positive is not None:
        raise UsageError("--positive does not apply to --multilabel or --multioutput data")


def _summary(paths, out_dir):
    lines, rows, nnz, queries = [], 0, 0, 0
    info = None
    for path in paths:
        info = shard_summary(path)
        rows += info["rows"]
        nnz += info["nnz"]
        # Ragged shards count examples and their parts (sequence positions, points).
        row, value = ("examples", "parts") if info["layout"] == "ragged" else ("rows", "nonzeros")
        text = f"{os.path.basename(path)}: {info['rows']:,} {row}, {info['nnz']:,} {value}"
        if info["queries"] is not None:
            queries += info["queries"]
            text += f", {info['queries']:,} queries"
        lines.append(text)
    labels = info["label_kind"]
    if info["n_classes"] is not None:
        noun = {"multilabel": "labels", "multioutput": "targets"}.get(labels, "classes")
        labels += f" ({info['n_classes']} {noun})"
    total = (f"total: {len(paths)} {info['layout']} shard{'s' if len(paths) != 1 else ''} "
             f"in {out_dir}: {rows:,} {row}, {info['n_features']:,} features, "
             f"{nnz:,} {value}")
    if info["queries"] is not None:
        total += f", {queries:,} queries"
    lines.append(total + f", labels {labels}")
    return lines


def _main(argv):
    args = parse_arguments(build_parser(), argv)
    name, copies = launched_size()  # from the environment: this command never initialises MPI
    if copies > 1:
        raise UsageError(f"runs on one process, and {name}={copies} says {copies} were started: "
                         "start it without mpiexec or srun -n (slurm/shard.sbatch is a single-task job)")
    _check_options(args)
    ragged = [structured_data.is_structured_npz(path) for path in args.inputs]
    try:
        if any(ragged):
            paths = _shard_structured(args, ragged)
        else:
            info = {}
            X, y, qid = read_input(args.inputs, multilabel=args.multilabel,
                                        multioutput=args.multioutput, n_features=args.n_features,
                                        label_column=args.label_column, info=info)
            paths = write_shards(X, y, args.out, args.parts, qid=qid,
                                      source=", ".join(args.inputs), dense=args.dense,
                                      multilabel=args.multilabel, multioutput=args.multioutput,
                                      positive=args.positive, overwrite=args.overwrite,
                                      exact_width=info["exact_width"], float32=args.float32)
    except MemoryError:
        raise InputError("out of memory while converting the input") from None
    if not args.quiet:
        for line in ([] if any(ragged) else info["notes"]) + _summary(paths, args.out):
            print(line)
    return 0


def _shard_structured(args, ragged):
    """Shard structured examples (``.npz`` inputs with x_values, x_offsets, y_values, y_offsets); return the paths."""
    if not all(ragged):
        raise UsageError(f"{args.inputs[ragged.index(False)]}: structured .npz inputs (x_values, ...) "
                         "cannot be mixed with other inputs")
    given = [option for option, value in (("--multilabel", args.multilabel), ("--multioutput", args.multioutput),
                                          ("--n-features", args.n_features), ("--positive", args.positive),
                                          ("--dense/--sparse", args.dense), ("--label-column", args.label_column or None))
             if value not in (None, False)]
    if given:
        raise UsageError(f"{given[0]} does not apply to structured examples")
    pieces = [structured_data.read_npz(path) for path in args.inputs]
    widths = {piece.shape[1] for piece in pieces}
    if len(widths) > 1:
        raise InputError(f"the structured inputs differ in the width of x_values: {sorted(widths)}")
    return structured_data.write_structured_shards(RaggedExamples.concatenate(pieces), args.out, args.parts,
                                                   source=", ".join(args.inputs), overwrite=args.overwrite)


def main(argv=None):
    """Run ``python -m prbmrm.cli.shard``.

    It runs on one process and never initialises MPI (it works where no MPI
    launcher is available, e.g. on a login node).

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status: 0 on success, 2 on bad options or input (one line
        ``prbmrm.cli.shard: error: ...`` on stderr, no partial output), 130 when
        interrupted.
    """
    try:
        return _main(argv)
    except PrbmrmError as error:
        print(f"{program(PROG)}: error: {error}", file=sys.stderr, flush=True)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print(f"{program(PROG)}: interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
