"""Built-in structured models against brute force over all labelings (chains) and all permutations (matching)."""

import itertools

import numpy as np
import pytest
from scipy.special import logsumexp

from prbmrm.distributed.comm import SerialComm
from prbmrm.errors import UsageError
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.structured import (ChainModel, MatchingModel, RaggedExamples, StructuredLoss, make_chain_data,
                               make_matching_data, pair_features)


def chain_instance(rng, length, n_states=3, n_features=2):
    model = ChainModel(n_states)
    x = rng.normal(size=(length, n_features))
    y = rng.integers(n_states, size=length)
    return model, x, y, itertools.product(range(n_states), repeat=length)


def matching_instance(rng, n, n_features=3):
    x = pair_features(rng.normal(size=(n, n_features)), rng.normal(size=(n, n_features)))
    return MatchingModel(), x, rng.permutation(n), itertools.permutations(range(n))


def instances(kind, seed=0):
    """Tiny random instances: every chain length 0..4 with 3 states, every matching size 0..5."""
    rng = np.random.default_rng(seed)
    sizes = range(5) if kind == "chain" else range(6)
    for size in sizes:
        for _ in range(4):
            model, x, y, labelings = (chain_instance if kind == "chain" else matching_instance)(rng, size)
            # Rounded weights make ties between labelings common.
            w = np.round(rng.normal(size=model.size_joint_feature(x.shape[1])), 1) * rng.choice([0.5, 3.0])
            yield model, x, y, [np.array(label, dtype=np.int64) for label in labelings], w


def chain_score(model, x, y, w):
    """<w, phi(x, y)> summed position by position, independently of joint_feature."""
    emission, transition, start = model.split(w, x.shape[1])
    score = sum(emission[state] @ x[t] for t, state in enumerate(y))
    score += sum(transition[a, b] for a, b in zip(y[:-1], y[1:]))
    return score + (start[y[0]] if len(y) else 0.0)


def matching_score(x, y, w):
    """<w, phi(x, y)> as the sum of the chosen entries of the n x n score matrix."""
    n = len(y)
    return sum(x[i * n + y[i]] @ w for i in range(n))


@pytest.mark.parametrize("kind", ["chain", "matching"])
def test_joint_feature_gives_the_model_score(kind):
    for model, x, y, labelings, w in instances(kind):
        for label in labelings[:20]:
            expected = chain_score(model, x, label, w) if kind == "chain" else matching_score(x, label, w)
            assert model.joint_feature(x, label) @ w == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("kind", ["chain", "matching"])
def test_loss_augmented_argmax_and_predict_equal_brute_force(kind):
    for model, x, y, labelings, w in instances(kind):
        def augmented(label):
            return (model.joint_feature(x, label) - model.joint_feature(x, y)) @ w + model.delta(y, label)

        values = [augmented(label) for label in labelings]
        y_bar = model.loss_augmented_argmax(x, y, w)
        assert model.check_label(x, y_bar) is None
        assert augmented(y_bar) == pytest.approx(max(values), abs=1e-12)
        scores = [model.joint_feature(x, label) @ w for label in labelings]
        y_star = model.predict(x, w)
        assert model.check_label(x, y_star) is None
        assert model.joint_feature(x, y_star) @ w == pytest.approx(max(scores), abs=1e-12)
        # Argmax equal up to ties: the answer is one of the brute-force maximizers.
        assert any(np.array_equal(y_bar, label) for label, value in zip(labelings, values)
                   if value >= max(values) - 1e-12)


def test_deltas_are_hamming_losses():
    chain, matching = ChainModel(3), MatchingModel()
    y, y_hat = np.array([0, 1, 2, 1]), np.array([0, 2, 2, 0])
    assert chain.delta(y, y_hat) == 2.0  # wrong positions, not divided by T
    assert matching.delta(np.array([0, 1, 2, 3]), np.array([1, 0, 2, 3])) == 0.5
    assert chain.delta(y, y) == matching.delta(y[:3], y[:3]) == 0.0


def test_chain_log_partition_and_expectation_equal_enumeration():
    for model, x, y, labelings, w in instances("chain", seed=1):
        scores = np.array([model.joint_feature(x, label) @ w for label in labelings])
        features = np.array([model.joint_feature(x, label) for label in labelings])
        log_z, expected = model.expected_joint_feature(x, w)
        assert log_z == pytest.approx(logsumexp(scores), abs=1e-10)
        np.testing.assert_allclose(expected, np.exp(scores - logsumexp(scores)) @ features, atol=1e-10)


def test_matching_has_no_logistic_form():
    # The loss refuses up front the forms the model cannot compute (no expected_joint_feature).
    for form in ("slack", "logistic"):
        with pytest.raises(ValueError, match=f"supports the forms margin, not '{form}'"):
            StructuredLoss(MatchingModel(), form)


def small_data(kind, seed):
    if kind == "chain":
        return ChainModel(3), make_chain_data(6, n_states=3, n_features=2, lengths=(0, 5), seed=seed)
    return MatchingModel(), make_matching_data(6, n_points=4, group_sizes=(2, 1), group_noise=(0.5, 2.0),
                                               seed=seed)


@pytest.mark.parametrize("kind, form", [("chain", "margin"), ("chain", "logistic"), ("matching", "margin")])
def test_risk_subgradient_inequality(kind, form):
    model, data = small_data(kind, seed=2)
    loss = StructuredLoss(model, form)
    rng = np.random.default_rng(3)
    dim = loss.weight_dim(data.shape[1])
    for _ in range(30):
        w, v = rng.normal(size=(2, dim)) * rng.choice([0.1, 1.0, 5.0])
        risk_w, g = loss.loss_gradient(w, data)
        risk_v, _ = loss.loss_gradient(v, data)
        assert risk_w >= 0.0
        assert risk_v >= risk_w + g @ (v - w) - 1e-9 * (1 + abs(risk_v))


def test_chain_logistic_gradient_equals_finite_differences():
    model, data = small_data("chain", seed=4)
    loss = StructuredLoss(model, "logistic")
    w = np.random.default_rng(5).normal(size=loss.weight_dim(data.shape[1]))
    _, gradient = loss.loss_gradient(w, data)
    step = 1e-6
    numeric = [(loss.loss_gradient(w + step * e, data)[0] - loss.loss_gradient(w - step * e, data)[0])
               / (2 * step) for e in np.eye(len(w))]
    np.testing.assert_allclose(gradient, numeric, atol=1e-6)


@pytest.mark.parametrize("kind", ["chain", "matching"])
def test_serial_risk_oracle_averages_the_structured_loss(kind):
    model, data = small_data(kind, seed=6)
    loss = StructuredLoss(model)
    oracle = DistributedRisk(loss, data, np.zeros(len(data)), len(data), SerialComm(), blocks=[0, 2, 6])
    w = np.random.default_rng(7).normal(size=oracle.dim)
    risk, a = oracle(w)
    total, gradient = 0.0, np.zeros(len(w))
    for x, y in data:
        example_risk, example_gradient = loss.loss_gradient(w, RaggedExamples.from_lists([x], [y],
                                                                                         data.shape[1]))
        total, gradient = total + example_risk, gradient + example_gradient
    assert risk == pytest.approx(total / len(data), rel=1e-12)
    np.testing.assert_allclose(a, gradient / len(data), rtol=1e-12, atol=1e-15)


def test_bmrm_learns_matching_weights_that_beat_uniform_weights():
    from prbmrm.solvers import minimize

    model = MatchingModel()
    data = make_matching_data(40, n_points=8, group_sizes=(2, 6), group_noise=(0.3, 10.0), seed=10)
    train, test = data[:10], data[10:]
    oracle = DistributedRisk(StructuredLoss(model), train, np.zeros(len(train)), len(train), SerialComm())
    w = minimize(oracle, np.zeros(oracle.dim), 1.0, method="bmrm").w

    def error(weights):
        return np.mean([model.delta(y, model.predict(x, weights)) for x, y in test])

    assert error(w) < 0.5 * error(np.ones(oracle.dim))


@pytest.mark.parametrize("make", [
    lambda seed: make_chain_data(5, lengths=(3, 9), seed=seed),
    lambda seed: make_matching_data(3, n_points=6, seed=seed),
])
def test_generators_are_deterministic_per_seed(make):
    first, again, other = make(11), make(11), make(12)
    for name in ("x_values", "x_offsets", "y_values", "y_offsets"):
        np.testing.assert_array_equal(getattr(first, name), getattr(again, name))
    assert not np.array_equal(first.x_values[:len(other.x_values)], other.x_values[:len(first.x_values)])


def test_chain_generator_emits_its_states():
    data = make_chain_data(40, n_states=3, n_features=4, lengths=(5, 8), noise=0.0, seed=1)
    model = ChainModel(3)
    assert all(model.check_label(x, y) is None and 5 <= len(y) <= 8 for x, y in data)
    np.testing.assert_array_equal(data.x_values[:, -1], 1.0)
    # Without noise a position's features are its state's mean: one distinct row per state.
    for state in range(3):
        rows = data.x_values[data.y_values == state]
        np.testing.assert_array_equal(rows, np.broadcast_to(rows[0], rows.shape))
    assert len(np.unique(data.x_values, axis=0)) == 3


def test_matching_generator_without_noise_is_solved_by_uniform_weights():
    data = make_matching_data(5, n_points=7, group_sizes=(2, 3), group_noise=(0.0, 0.0), seed=3)
    model = MatchingModel()
    for x, y in data:
        assert model.check_label(x, y) is None
        np.testing.assert_array_equal(model.predict(x, np.ones(5)), y)
        # The true partner's features coincide: its pair row is zero.
        np.testing.assert_array_equal(x[np.arange(7) * 7 + y], 0.0)


def test_check_label_rejects_bad_labels():
    chain, matching = ChainModel(3), MatchingModel()
    x = np.zeros((4, 2))
    assert chain.check_label(x, np.array([0, 1, 2, 0])) is None
    assert "one state per position" in chain.check_label(x, np.array([0, 1]))
    assert "0..2" in chain.check_label(x, np.array([0, 1, 3, 0]))
    assert matching.check_label(x, np.array([1, 0])) is None
    assert "permutation" in matching.check_label(x, np.array([1, 1]))
    assert "n * n" in matching.check_label(np.zeros((5, 2)), np.array([0, 1]))
    with pytest.raises(ValueError, match="n \\* n"):
        matching.predict(np.zeros((5, 2)), np.zeros(2))
    with pytest.raises(UsageError, match="n_states must be at least one state, got 0"):
        ChainModel(0)


@pytest.mark.distributed
@pytest.mark.parametrize("kind, form", [("chain", "margin"), ("chain", "logistic"), ("matching", "margin")])
def test_ranks_holding_blocks_of_examples_agree_with_one_rank(comm, kind, form):
    from prbmrm.distributed.oracle import run_distributed

    model, data = small_data(kind, seed=8)
    data = data[:6]
    # Six canonical blocks of one example; each rank holds a contiguous run of them.
    owner = np.arange(6) * comm.size // 6
    mine = np.flatnonzero(owner == comm.rank)
    local = data[mine[0]:mine[-1] + 1] if len(mine) else data[0:0]
    oracle = DistributedRisk(StructuredLoss(model, form), local, np.zeros(len(local)), len(data), comm,
                             blocks=np.arange(len(local) + 1))
    points = np.random.default_rng(9).normal(size=(3, oracle.dim))
    values = run_distributed(oracle, lambda risk: [risk(w) for w in points])
    if comm.is_root:
        serial = DistributedRisk(StructuredLoss(model, form), data, np.zeros(len(data)), len(data), SerialComm(),
                                 blocks=np.arange(len(data) + 1))
        for w, (risk, a) in zip(points, values):
            risk_serial, a_serial = serial(w)
            assert risk == risk_serial
            np.testing.assert_array_equal(a, a_serial)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loss, params, make", [
    ("chain", ["n_states=3", "form=logistic"], lambda: make_chain_data(30, n_states=3, n_features=4,
                                                                       lengths=(3, 8), seed=3)),
    ("matching", [], lambda: make_matching_data(12, n_points=6, seed=4)),
])
def test_built_in_models_train_from_the_command_line_on_two_ranks(tmp_path, loss, params, make):
    from helpers import run_ranks
    from prbmrm.model import load_model
    from prbmrm.structured.data import write_structured_shards
    from prbmrm.training import run

    examples = make()
    write_structured_shards(examples, tmp_path / "s", 3)
    loss_params = [arg for param in params for arg in ("--loss-param", param)]
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--data", str(tmp_path / "s"), "--loss", loss,
                                 *loss_params, "--lam", "0.1", "--out", str(tmp_path / "m.h5")], timeout=100)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "mean Delta" in completed.stdout
    # The 2-rank command line trains the in-process serial model, bitwise.
    serial, _, _ = run(str(tmp_path / "s"), loss=loss, loss_params=dict(p.split("=") for p in params), lam=0.1,
                       comm=SerialComm())
    np.testing.assert_array_equal(load_model(str(tmp_path / "m.h5")).w, serial.w)
