"""The default solver: the rule, the pick from the data's properties, the hand-over from a stalled solver,
and the same default from the command line, fit and the estimators."""

import numpy as np
import pytest

from helpers import cvxpy_optimum, load_svmlight
from prbmrm.solvers import default_solver, minimize  # first: the base commit's prbmrm.regularizers imports circularly
import prbmrm.solvers.auto as auto
from prbmrm.distributed.comm import SerialComm
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.losses import get_loss
from prbmrm.regularizers import get_regularizer


def oracle_of(loss, X, y):
    loss = get_loss(loss)
    loss.prepare(np.unique(y), "binary")
    return DistributedRisk(loss, X, y, len(y), SerialComm())


def test_default_solver_rule():
    assert default_solver(1e-4) == default_solver(1e-4, get_regularizer("quadratic", B=2.0)) == "auto"
    # BMRM where planes carry over from other lambdas, and for the other regularizers.
    assert default_solver([1e-2, 1e-3]) == default_solver(1e-4, "l2", reuse_planes=True) == "bmrm"
    assert default_solver(1e-4, "l1") == default_solver(1e-4, "entropy") == "bmrm"
    # Party mode: every sum a secure aggregation of the risk, which TRON's products are not.
    assert default_solver(1e-4, party=True) == "proximal"


def test_pick_follows_the_loss_and_the_data(monkeypatch):
    X, y = load_svmlight("a9a.xz")
    X, y = X[:2000], y[:2000]
    l2 = get_regularizer("l2")
    assert auto.pick_solver(oracle_of("logistic", X, y), l2)[0] == "tron"
    assert auto.pick_solver(oracle_of("squared_hinge", X, y), l2)[0] == "tron"
    # The hinge loss with l2 on narrow rows: dual coordinate descent where a large share of the rows' second
    # moment lies along their mean (a9a's: some categories are in most rows), at any scale (its first
    # certificate then says whether it goes on: the next test); the proximal method on rows of zero mean or
    # with another regularizer.
    dense = X.toarray()
    share = np.sum(dense.mean(axis=0) ** 2) / np.mean(np.sum(dense ** 2, axis=1))
    assert auto.common_share(oracle_of("hinge", X, y)) == pytest.approx(share, rel=1e-12) and share > auto.DCD_COMMON
    assert auto.pick_solver(oracle_of("hinge", X, y), l2)[0] == "dcd"
    assert auto.pick_solver(oracle_of("hinge", dense, y), l2)[0] == "dcd"  # dense rows alike
    assert auto.pick_solver(oracle_of("hinge", 0.5 * X, y), l2)[0] == "dcd"
    signs = np.random.default_rng(0).choice([-1.0, 1.0], size=X.shape)
    centered = X.multiply(signs).tocsr()  # the same nonzeros, each of a random sign: rows of (nearly) zero mean
    assert auto.common_share(oracle_of("hinge", centered, y)) < auto.DCD_COMMON
    assert auto.pick_solver(oracle_of("hinge", centered, y), l2)[0] == "proximal"
    assert auto.pick_solver(oracle_of("hinge", X, y), get_regularizer("quadratic", B=2.0))[0] == "proximal"
    # One column in raw counts 10^4 times the others' scale (kddcup99's): Newton all the same (preconditioned).
    counts = X.tolil()
    counts[:, 0] = np.arange(X.shape[0])[:, None] * 10.0
    assert auto.pick_solver(oracle_of("logistic", counts.tocsr(), y), l2)[0] == "tron"
    # As many weights as nonzeros (hashed text): for the hinge loss with l2, dual coordinate descent (not on
    # more than DCD_NONZEROS nonzeros, nor with another regularizer); BMRM otherwise.
    wide = X.copy()
    wide.resize((X.shape[0], 40 * X.nnz // auto.PROXIMAL_RATIO))
    assert wide.shape[1] >= auto.DCD_WEIGHTS
    assert auto.pick_solver(oracle_of("hinge", wide, y), l2)[0] == "dcd"
    assert auto.pick_solver(oracle_of("hinge", wide, y), get_regularizer("quadratic", B=2.0))[0] == "bmrm"
    monkeypatch.setattr(auto, "DCD_NONZEROS", X.nnz // 2)
    assert auto.pick_solver(oracle_of("hinge", wide, y), l2)[0] == "bmrm"
    # Rows sharing their mean on more than DCD_COMMON_NONZEROS nonzeros: the proximal method.
    monkeypatch.setattr(auto, "DCD_NONZEROS", 2 * X.nnz)
    monkeypatch.setattr(auto, "DCD_COMMON_NONZEROS", X.nnz // 2)
    assert auto.pick_solver(oracle_of("hinge", X, y), l2)[0] == "proximal"


@pytest.mark.parametrize("lam", [1e-2, 1e-6])
def test_dual_coordinate_descent_hands_a_large_box_to_the_proximal_method(lam):
    X, y = load_svmlight("a9a.xz")
    X, y = X[:3000], y[:3000]
    rows = []
    result = minimize(oracle_of("hinge", X, y), np.zeros(X.shape[1]), lam, method="auto", epsilon=1e-5,
                      rel_epsilon=0, callback=rows.append)
    assert result.success and result.gap <= 1e-5
    first = rows[0]
    # The box C = 1 / (lam m) against the rows' squared norms: 0.05 at lam 1e-2, 4,600 at 1e-6; dual coordinate
    # descent's first certificate measures it.
    handed = first.lower_bound < first.best_objective / auto.DCD_BOX
    assert handed == (lam == 1e-6)
    assert ("then proximal" in result.message) == handed and "(dcd:" in result.message
    assert [row.iteration for row in rows] == list(range(1, result.nit + 1))
    if handed:  # the proximal method's rows follow the certificate's, its bound joined with dcd's
        plain = minimize(oracle_of("hinge", X, y), np.zeros(X.shape[1]), lam, method="proximal", epsilon=1e-5,
                         rel_epsilon=0)
        assert result.nit == plain.nit + 1
        np.testing.assert_array_equal(result.history["lower_bound"][1:],
                                      np.maximum(plain.history["lower_bound"], first.lower_bound))
    # Every bound below cvxpy's optimum, the best point within the gap of it.
    optimum = cvxpy_optimum(X, y, "hinge", lam)
    assert np.all(result.history["lower_bound"] <= optimum + 1e-7)
    assert result.fun - optimum <= 1e-5 + 1e-7


@pytest.mark.parametrize("matrix_dim, successor", [(auto.MATRIX_DIM, "tron"), (0, "bmrm")])
def test_a_stalled_solver_hands_over(monkeypatch, matrix_dim, successor):
    """To TRON with the Hessian as a matrix for the hinge on at most MATRIX_DIM weights (a9a's 124 here), else to
    BMRM."""
    X, y = load_svmlight("a9a.xz")
    X, y = X[:3000], y[:3000]
    lam = 1e-5
    # A watch that judges every solver stalled after 5 iterations: the successor goes on and certifies the gap.
    monkeypatch.setattr(auto, "STALL_MIN_ITER", 5)
    monkeypatch.setattr(auto, "STALL_FACTOR", 0.0)
    monkeypatch.setattr(auto, "MATRIX_DIM", matrix_dim)
    assert auto.successor(oracle_of("hinge", X, y), get_regularizer("l2")) == successor
    rows = []
    result = minimize(oracle_of("hinge", X, y), np.zeros(X.shape[1]), lam, method="auto", epsilon=1e-5,
                      rel_epsilon=0, callback=rows.append, first="proximal")
    assert result.success and result.gap <= 1e-5
    assert f"stalled at iteration 5, then {successor}" in result.message
    assert [row.iteration for row in rows] == list(range(1, result.nit + 1))
    np.testing.assert_array_equal(result.history["iteration"], np.arange(1, result.nit + 1))
    # The joined rows keep the best objective and bound of the whole run.
    assert np.all(np.diff(result.history["best_objective"]) <= 0)
    assert np.all(np.diff(result.history["lower_bound"][5:]) >= 0)
    reference = minimize(oracle_of("hinge", X, y), np.zeros(X.shape[1]), lam, method="bmrm", epsilon=1e-7,
                         rel_epsilon=0)
    assert np.all(result.history["lower_bound"] <= reference.fun + 1e-12)
    assert result.fun - reference.lower_bound <= 1e-5 + 1e-7


def test_max_iter_says_so():
    X, y = load_svmlight("a9a.xz")
    result = minimize(oracle_of("hinge", X[:2000], y[:2000]), np.zeros(X.shape[1]), 1e-6, method="auto",
                      epsilon=1e-9, rel_epsilon=0, max_iter=30)
    assert result.status == 2 and not result.success and result.nit == 30
    assert result.message.startswith("maximum number of iterations reached")


def test_the_default_runs_what_its_pick_runs(tmp_path, monkeypatch):
    import prbmrm
    from prbmrm.cli.train import main
    from prbmrm.estimators import BMRMClassifier
    from prbmrm.model import load_model
    from prbmrm.training import load_demo

    X, y = load_demo()
    # The demo's 569 x 30 dense rows count as "few nonzeros per weight": the default must run BMRM's path.
    monkeypatch.setattr(auto, "PROXIMAL_RATIO", 10 ** 9)
    monkeypatch.setattr(auto, "DCD_NONZEROS", 0)
    runs = {}
    for name, args in (("default", []), ("bmrm", ["--solver", "bmrm"])):
        assert main(["--lam", "1e-3", "--quiet", "--out", str(tmp_path / f"{name}.h5")] + args, SerialComm()) == 0
        runs[name] = load_model(str(tmp_path / f"{name}.h5"))
    fitted = prbmrm.fit(None, lam=1e-3)
    assert runs["default"].attrs["solver"] == fitted.attrs["solver"] == "auto"
    assert runs["default"].attrs["iterations"] == runs["bmrm"].attrs["iterations"] == fitted.attrs["iterations"]
    np.testing.assert_array_equal(runs["default"].w, runs["bmrm"].w)
    estimator = BMRMClassifier(lam=1e-3, bias=False).fit(X, y)
    assert estimator.n_iter_ == runs["bmrm"].attrs["iterations"]
    assert prbmrm.fit(None, lam=[1e-2, 1e-3]).attrs["solver"] == "bmrm"
    # The logistic loss: Newton's method.
    assert "tron" in prbmrm.fit(None, lam=1e-3, loss="logistic").attrs["message"]


@pytest.mark.distributed
@pytest.mark.parametrize("loss, lam", [("logistic", 1e-4), ("hinge", 1e-4), ("hinge", 1e-6)])
def test_the_default_is_bitwise_the_same_on_any_number_of_ranks(comm, mpi_tmp_path, loss, lam):
    from helpers import shared_shards
    from prbmrm.distributed.oracle import run_distributed
    from prbmrm.io import load_local

    X, y = load_svmlight("a9a.xz")
    directory = shared_shards(comm, mpi_tmp_path / "auto", X[:3000], y[:3000], parts=comm.size + 1)

    def run(communicator):
        local = load_local(directory, communicator, bias=True)
        oracle = DistributedRisk(get_loss(loss), local.X, local.y, local.n_examples_total, communicator,
                                 local.blocks)
        return run_distributed(oracle, lambda risk: minimize(risk, np.zeros(oracle.dim), lam, method="auto",
                                                             epsilon=1e-6, rel_epsilon=0))

    result = run(comm)
    if comm.is_root:
        expected = run(SerialComm())
        assert result.success and result.message == expected.message and result.nit == expected.nit
        assert np.array_equal(result.w, expected.w)
        assert np.array_equal(result.history["lower_bound"], expected.history["lower_bound"])
        # At lam 1e-6 dual coordinate descent's first certificate hands over to the proximal method.
        assert ("then proximal" in result.message) == (lam == 1e-6)
