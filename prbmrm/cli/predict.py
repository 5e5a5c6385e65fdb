"""Apply a model: ``python -m prbmrm.cli.predict --model MODEL.h5 --data DIR_OR_FILE [--out FILE]``.

Writes one decision value per example (in data order) and prints the loss's
natural measures (accuracy and error rate for classification, RMSE and MAE for
regression). Under ``mpiexec`` each rank scores its own shards and writes its
rows at its place in the output file; the measures come from sums (and, for
the ROC area and the PRBEP, a sort of the scores across ranks), so no rank
gathers every score, except for the measures of the losses that need them
all on one rank (ranking and multilabel measures but the ROC area and PRBEP).

Imports: numpy; of prbmrm: :mod:`prbmrm.cli.common`, :mod:`prbmrm.errors`, :mod:`prbmrm.io.inputs`,
:mod:`prbmrm.io`, :mod:`prbmrm.losses`, :mod:`prbmrm.model`, :mod:`prbmrm.cli.shard`.
"""

import io
import json
import os
import sys

import numpy as np

from .common import ArgumentParser, run
from .config import parse_arguments
from ..io import STRUCTURED, load_local
from ..errors import CollectiveError, InputError, UsageError
from ..io.inputs import check_for_model, describe_mapping, load_input
from ..losses import get_loss
from ..model import check_writable, load_model
from .shard import add_label_column_option


def align_label_columns(Y, data_classes, model_classes, where):
    """Return the multilabel indicator `Y` (columns: `data_classes`) with the model's columns.

    Raises
    ------
    CollectiveError
        If the data has a label id the model was not trained on.
    """
    data_classes = np.asarray(data_classes, dtype=np.float64)
    model_classes = np.asarray(model_classes, dtype=np.float64)
    if np.array_equal(data_classes, model_classes):
        return Y
    unknown = np.setdiff1d(data_classes, model_classes)
    if unknown.size:
        raise CollectiveError(f"{where}: label {unknown[0]:g} is not one of the model's "
                              f"{len(model_classes)} labels")
    aligned = np.zeros((Y.shape[0], len(model_classes)), dtype=Y.dtype)
    aligned[:, np.searchsorted(model_classes, data_classes)] = Y
    return aligned


def main(argv, comm):
    """Entry point of ``python -m prbmrm.cli.predict``; returns the exit status."""
    parser = ArgumentParser(prog="prbmrm.cli.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model file written by prbmrm.cli.train")
    parser.add_argument("--data", required=True,
                        help="shard directory, shard file(s) or glob, or an SVMlight/LIBSVM, .npz or .csv file")
    parser.add_argument("--out", help="write the decision values here, one line per example "
                        "(k values for multi-output models)")
    parser.add_argument("--labels", help="write the predicted labels here, one per line "
                        "(classification losses)")
    parser.add_argument("--lam", type=float, help="the lambda of a lambda path's model to apply "
                        "(default: the path's smallest, the model's /w)")
    parser.add_argument("--positive", type=float, metavar="LABEL",
                        help="one-vs-rest: the raw label the model's +1 stands for (default: the "
                             "model's own mapping, recorded when it was trained with --positive)")
    add_label_column_option(parser)
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    args = parse_arguments(parser, argv)
    error, model = None, None
    try:
        model = load_model(args.model)
        for path in (args.out, args.labels):
            if comm.is_root and path:
                check_writable(path)
    except InputError as problem:
        error = problem
    comm.check(error)
    if args.lam is not None:
        model = model.at_lam(args.lam)
    loss = get_loss(model.attrs["loss"], **json.loads(model.attrs.get("loss_params", "{}")))
    loss.prepare(model.attrs.get("classes"), model.attrs.get("label_kind"))
    if loss.structured:
        return predict_structured(args, model, loss, comm)
    if args.labels and not loss.predicts_labels:
        raise UsageError(f"--labels: loss {loss.name!r} predicts scores, not labels")
    n_model = model.w.shape[0]
    classes = model.attrs.get("classes")
    multilabel = model.attrs.get("label_kind") == "multilabel"
    positive = model.attrs.get("positive")
    if args.positive is not None and positive is not None and args.positive != positive:
        raise UsageError(f"--positive {args.positive:g}: the model {args.model} was trained with "
                         f"--positive {positive:g}")
    notes = []
    local = load_input(args.data, comm, positive=positive if args.positive is None else args.positive,
                       label_column=args.label_column, n_features=n_model,
                       label_kind=model.attrs.get("label_kind"), notes=notes)
    if multilabel and local.label_kind == "multilabel":
        # Every rank sees the same global label ids, so every rank raises alike.
        local.y = align_label_columns(local.y, local.classes, classes, args.data)
    attrs = dict(model.attrs, n_features=model.attrs.get("n_features", n_model))
    check_for_model(local, attrs, args.data, args.model)
    if local.n_features < n_model:
        # An SVMlight test file whose highest feature index is lower than the training data's.
        model.w = model.w[:local.n_features]
    scores, labels = model.decision_function(local.X), local.y
    if model.w.ndim == 2:
        scores = scores.reshape(-1, model.w.shape[1])
        labels = labels.reshape(len(scores), -1) if labels.size != len(scores) else labels
    else:
        scores, labels = scores.ravel(), labels.ravel()
    # In the training data's own labels (a two-class model trained on 0/1 answers 0/1).
    predicted = model.labels(scores) if loss.predicts_labels else None
    for path, values in ((args.out, scores), (args.labels, predicted)):
        if path:
            write_in_rank_order(path, values, comm)
    n_total = int(comm.gather_counts(len(scores)).sum())
    measures = None if args.quiet else loss.shared_metrics(scores, labels, local.qid, comm)
    if measures is None and not args.quiet:
        # Measures that need every score on one rank (ranking measures of the other losses).
        everything = [comm.gather_scalars(np.ravel(values)) for values in (scores, labels)]
        qid = None if local.qid is None else comm.gather_scalars(local.qid)
        if comm.is_root:
            scores, labels = everything[0].reshape((-1,) + scores.shape[1:]), everything[1]
            labels = labels.reshape(len(scores), -1) if labels.size != len(scores) else labels
            measures = loss.metrics(scores, labels, qid)
    if comm.is_root and not args.quiet:
        for line in notes + [describe_mapping(local)] * (local.positive is not None):
            print(line)
        shown = ", ".join(f"{name} {value:.6g}" for name, value in measures.items())
        print(f"{n_total} examples from {args.data}: {shown}")
        for path, what in ((args.out, "decision values"), (args.labels, "labels")):
            if path:
                print(f"{what} written to {path}")
    return 0


def write_in_rank_order(path, values, comm):
    """Write the rows of every rank into `path` as text, rank 0's first (collective; ``%.17g``).

    Each rank formats its own rows and writes them at its offset (the bytes of
    the lower ranks) into one temporary file next to `path`, which rank 0
    creates and, once every rank wrote, renames: no rank holds the rows of
    another. The file must lie on a file system every rank sees.

    Raises
    ------
    CollectiveError
        On every rank, naming the file and the rank that could not write.
    """
    buffer = io.BytesIO()
    np.savetxt(buffer, values, fmt="%.17g")
    data = buffer.getvalue()
    sizes = comm.gather_counts(len(data))
    temporary = f"{path}.tmp-{comm.bcast_object(os.getpid())}"
    error = None
    if comm.is_root:
        try:
            with open(temporary, "wb") as stream:
                stream.truncate(int(sizes.sum()))
        except OSError as problem:
            error = InputError(f"{path}: cannot write the file: {problem.strerror or problem}")
    comm.check(error)
    try:
        descriptor = os.open(temporary, os.O_WRONLY)
        try:
            offset, view = int(sizes[:comm.rank].sum()), memoryview(data)
            while view:
                written = os.pwrite(descriptor, view, offset)
                view, offset = view[written:], offset + written
        finally:
            os.close(descriptor)
    except OSError as problem:
        error = InputError(f"{path}: rank {comm.rank} cannot write its rows into {temporary}: "
                           f"{problem.strerror or problem} (the file must be on a file system every rank sees)")
    try:
        comm.check(error)
    except CollectiveError:
        if comm.is_root:
            os.remove(temporary)
        raise
    if comm.is_root:
        os.replace(temporary, path)


def predict_structured(args, model, loss, comm):
    """``prbmrm.cli.predict`` for a structured loss: predicted labels and mean Delta (collective).

    Each rank predicts its own examples; rank 0 gathers their labels' parts
    (scalars) and writes one line per example, the predicted label's values
    separated by spaces.
    """
    if args.out:
        raise UsageError("--out: a structured model has no decision values (--labels writes its predictions)")
    local = load_local(args.data, comm)
    # Every rank sees the same global label kind and width, so every rank raises alike.
    if local.label_kind != STRUCTURED:
        raise UsageError(f"{args.data}: model {args.model} is a structured model ({loss.name!r}), "
                         "the data are not structured examples")
    if loss.weight_dim(local.n_features) != model.w.size:
        raise UsageError(f"{args.data}: parts of {local.n_features} features make a joint feature map of "
                         f"{loss.weight_dim(local.n_features)} weights, the model {args.model} has {model.w.size}")
    w = np.ravel(model.w)
    predicted = loss.predict_examples(local.X, w)
    deltas = comm.gather_scalars([loss.model.delta(y, p) for (_, y), p in zip(local.X, predicted)])
    sizes = comm.gather_scalars([np.size(p) for p in predicted])
    values = comm.gather_scalars(np.concatenate([np.ravel(p) for p in predicted]) if predicted else [])
    if not comm.is_root:
        return 0
    if args.labels:
        rows = np.split(values, np.cumsum(sizes.astype(np.int64))[:-1])
        temporary = args.labels + f".tmp-{os.getpid()}"
        with open(temporary, "w") as f:
            f.writelines(" ".join(f"{v:.17g}" for v in row) + "\n" for row in rows)
        os.replace(temporary, args.labels)
    if not args.quiet:
        print(f"{len(deltas)} examples from {args.data}: mean_delta {np.mean(deltas):.6g}")
        if args.labels:
            print(f"labels written to {args.labels}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main, "prbmrm.cli.predict"))
