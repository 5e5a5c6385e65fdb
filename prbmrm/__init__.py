"""prbmrm: distributed bundle methods for regularized risk minimization.

Trains regularized linear models with BMRM (Teo, Vishwanathan, Smola and Le,
JMLR 2010) on data split into HDF5 shards, one or more per MPI rank: rank 0
holds the bundle and solves the subproblem, every rank computes the risk and
subgradient of its own shard, and one Allreduce combines them per iteration.

From Python: :func:`fit` trains and returns a :class:`prbmrm.model.Model`
(``save``, ``predict``, ``decision_function``, ``score``), :func:`load` reads
a model file, and the scikit-learn estimators (:class:`BMRMClassifier`, ...)
are importable from here. They are imported on first use, so ``import
prbmrm`` stays light (no h5py, scikit-learn or MPI).

Imports: of prbmrm: :mod:`prbmrm.distributed.comm`, :mod:`prbmrm.model`,
:mod:`prbmrm.solvers`, :mod:`prbmrm.training`.
"""

from .version import __version__

# Names served on first use: name -> module (PEP 562), to keep `import prbmrm` light and free of cycles.
_LAZY = {"BMRMClassifier": "estimators", "BMRMRegressor": "estimators", "BMRMRanker": "estimators",
         "BMRMMultilabelClassifier": "estimators", "Model": "model"}

__all__ = ["__version__", "fit", "load", *_LAZY]


def fit(data=None, **options):
    """Train a model and return it (on every rank).

    Parameters
    ----------
    data : str, list of str, tuple (X, y) or None
        Shards (a directory, file or glob), an SVMlight/LIBSVM, ``.npz`` or
        ``.csv`` file, or in-memory arrays ``(X, y)``; None: the embedded
        demo data.
    **options
        Keywords of :func:`prbmrm.training.fit`: ``loss``, ``lam``, ``bias``,
        ``solver``, ``reg``, ``epsilon``, ``rel_epsilon``, ``max_iter``,
        ``positive`` (one-vs-rest: this label is +1, the others -1),
        ``label_column`` (CSV), ...

    Returns
    -------
    prbmrm.model.Model
        With the training summary and label mapping in ``attrs``.

    Raises
    ------
    prbmrm.errors.PrbmrmError
        For bad options or data (UsageError, InputError), on every rank alike.
    """
    import time

    from .distributed.comm import get_comm
    from .training import DEMO_NAME, build_model
    from .training import fit as train

    comm = options.pop("comm", None) or get_comm()
    started = time.perf_counter()
    result, local, loss = train(data, comm=comm, **options)
    model = None
    if comm.is_root:
        name = options.get("loss", "hinge")
        settings = {key: options.get(key, default) for key, default in
                    (("lam", 1e-4), ("loss_params", None), ("reg", "l2"), ("reg_params", None), ("bias", False))}
        # The model records the solver that ran: without one named, fit picked it by the data.
        settings["solver"] = getattr(result, "last", result).solver
        shown = {key: value for key, value in dict(options, solver=settings["solver"]).items()
                 if isinstance(value, (str, int, float, bool))}
        model = build_model(result, local, loss, comm.size, time.perf_counter() - started,
                            loss_name=name if isinstance(name, str) else loss.name,
                            data=data if isinstance(data, str) else DEMO_NAME if data is None else "arrays",
                            options=shown, **settings)
    return comm.bcast_object(model)


def load(path):
    """Read a model file written by ``prbmrm train`` or :meth:`prbmrm.model.Model.save`.

    Returns
    -------
    prbmrm.model.Model
    """
    from .model import load_model

    return load_model(path)


def __getattr__(name):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
