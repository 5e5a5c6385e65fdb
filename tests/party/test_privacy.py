"""Party mode: secure aggregation, refusals, the coordinator check, the audit log, differential privacy.

Multi-party runs need 3 and 4 ranks: they run tests/party/privacy_ranks.py under
mpiexec (with timeouts) and check what it saved. The tests marked
``distributed`` run here on 1 rank and under mpiexec -n 2 and -n 3 through
tests/distributed/test_mpiexec.py: with fewer than 3 ranks they check the refusal.
"""

import json
import math
import os
import pickle
import re

import numpy as np
import pytest

from helpers import REPO, load_svmlight, run_ranks
from prbmrm.io import write_shards
from prbmrm.errors import CollectiveError, CoordinatorError, UsageError
from prbmrm.losses import LOSSES, get_loss
from prbmrm.model import load_model
from prbmrm.party.session import PARTY_SOLVERS, AuditLog, Party, load_party, party_path
from prbmrm.party.privacy import ClippedLoss
from prbmrm.regularizers import get_regularizer
from prbmrm.party.secure import MIN_PARTIES, RESCALE_BITS, SecureComm, gaussian_noise, keystream

DRIVER = os.path.join(REPO, "tests", "party", "privacy_ranks.py")
A9A_ROWS = 3000


def split_rows(n, parties, seed):
    """Uneven contiguous row ranges, one per party."""
    cuts = np.sort(np.random.default_rng(seed).choice(np.arange(n // 10, n - n // 10), parties - 1,
                                                      replace=False))
    return np.concatenate([[0], cuts, [n]])


@pytest.fixture(scope="module")
def party_data(tmp_path_factory):
    """For 3 and 4 parties: a9a (first 3000 rows, ±1) and dna (3 classes), each party's rows converted
    on their own (DIR/NAME-site-R) and all rows as one shard set (DIR/NAME-all)."""
    root = tmp_path_factory.mktemp("parties")
    a9a = load_svmlight("a9a.xz", 123)
    sets = {"a9a": (a9a[0][:A9A_ROWS], a9a[1][:A9A_ROWS]), "dna": load_svmlight("dna.scale.xz")}
    for parties in (3, 4):
        for name, (X, y) in sets.items():
            bounds = split_rows(len(y), parties, seed=parties)
            for r in range(parties):
                write_shards(X[bounds[r]:bounds[r + 1]], y[bounds[r]:bounds[r + 1]],
                             root / str(parties) / f"{name}-site-{r}", 1)
            write_shards(X, y, root / str(parties) / f"{name}-all", parties)
    return root


def run_driver(ranks, *args, timeout=120):
    completed, _ = run_ranks(ranks, [DRIVER, *map(str, args)], timeout=timeout)
    return completed


# ---- Secure aggregation equals plain training --------------------------------------------------

@pytest.mark.parametrize("parties", [3, 4])
def test_party_mode_gives_the_plain_model(party_data, tmp_path, parties):
    out = tmp_path / "results.npz"
    completed = run_driver(parties, "compare", party_data / str(parties), out)
    assert completed.returncode == 0, completed.stderr[-3000:]
    saved = np.load(out)
    for case in ("hinge", "logistic", "multiclass_hinge"):
        # Every party verified the coordinator at every step, found nothing, and received the model.
        np.testing.assert_array_equal(saved[f"{case}/received"], np.ones(parties))
        for column in ("objective", "lower_bound"):
            plain, party = saved[f"{case}/plain/{column}"], saved[f"{case}/party/{column}"]
            assert len(plain) == len(party), case
            np.testing.assert_allclose(party, plain, rtol=1e-9, err_msg=f"{case} {column}")
        w_plain, w_party = saved[f"{case}/plain/w"], saved[f"{case}/party/w"]
        np.testing.assert_allclose(w_party, w_plain, rtol=0, atol=1e-9 * np.abs(w_plain).max(),
                                   err_msg=case)
        # BMRM's loose subproblems (its default) and the default solver in party mode: paths of
        # their own (privacy_ranks.compare says why), ending within the certified gaps of the plain
        # run's optimum.
        plain_best = saved[f"{case}/plain/objective"].min()
        for kind in ("loose", "default"):
            best = saved[f"{case}/{kind}/objective"].min()
            gaps = saved[f"{case}/{kind}/gap"][-1] + saved[f"{case}/plain/gap"][-1]
            assert abs(best - plain_best) <= gaps, (case, kind)
            assert saved[f"{case}/{kind}/lower_bound"].max() <= plain_best, (case, kind)


# ---- What travels --------------------------------------------------------------------------------

def r_squared(message, truth):
    """R^2 of the least-squares fit of `message` by ``c * truth + c0``."""
    A = np.column_stack([truth, np.ones_like(truth)])
    residual = message - A @ np.linalg.lstsq(A, message, rcond=None)[0]
    return 1.0 - residual @ residual / np.sum((message - message.mean()) ** 2)


def limbs(message, n):
    """The high and low limbs of a message of n values, as signed integers in floats."""
    values = message[:2 * n].view(np.int64).astype(np.float64)
    return values[:n], values[n:]


def unmask(sent, me, keys, counter, peers):
    """Party `me`'s message with the masks it shares with `peers` removed (uint64)."""
    value = sent.copy()
    for peer in peers:
        mask = keystream(keys[peer], counter, len(value))
        if peer > me:
            value -= mask
        else:
            value += mask
    return value


def test_no_message_reveals_a_partys_risk_or_gradient(party_data, tmp_path):
    parties = 3
    completed = run_driver(parties, "transcript", party_data / str(parties), tmp_path / "t")
    assert completed.returncode == 0, completed.stderr[-3000:]
    runs = []
    for r in range(parties):
        with open(tmp_path / f"t-{r}.pickle", "rb") as f:
            runs.append(pickle.load(f))
    truths = [run["truths"] for run in runs]
    T, n = truths[0].shape  # evaluations, d + 1 sums
    assert T == 60
    sums = [[(sent[0], received) for name, sent, received in run["records"] if name == "allreduce_sum"]
            for run in runs]
    for r, run in enumerate(runs):
        # Nothing else carries data: the public keys, the data's format, w, the result, error flags.
        assert {name for name, _, _ in run["records"]} <= {"bcast_object", "bcast_array", "allreduce_sum",
                                                           "check"}
        assert len(sums[r]) == run["messages"]
        # On the wire the masks cancel: every party receives the sum of what all parties sent.
        for k, (_, received) in enumerate(sums[r]):
            np.testing.assert_array_equal(received, np.sum([sums[p][k][0] for p in range(parties)], axis=0))
    # The risk-and-gradient messages: n high limbs, n low limbs, 3 status counters; after a
    # fixed-point overflow (counter 0 of the total) the same evaluation is sent again, rescaled.
    evaluations = [k for k, (sent, received) in enumerate(sums[0])
                   if len(sent) == 2 * n + 3 and received[2 * n] == 0]
    assert len(evaluations) == T
    retried = [k for k, (sent, received) in enumerate(sums[0]) if len(sent) == 2 * n + 3 and received[2 * n]]
    assert retried  # the range is found in the first evaluations
    for k in retried:
        # A round that overflowed reveals nothing: its total is no party's sums, nor their sum.
        t = np.searchsorted(evaluations, k)
        for truth in [truths[r][t] for r in range(parties)] + [np.sum([u[t] for u in truths], axis=0)]:
            for limb in limbs(sums[0][k][1], n):
                assert r_squared(limb, truth) < 0.3
    masked_series = {r: [] for r in range(parties)}
    for t, k in enumerate(evaluations):
        for r, run in enumerate(runs):
            sent = sums[r][k][0]
            truth = truths[r][t]
            for limb in limbs(sent, n):
                assert r_squared(limb, truth) < 0.3
            masked_series[r].append(limbs(sent, n))
            # Control: with all of its masks removed, the message is this party's sums in fixed point.
            others = [p for p in range(parties) if p != r]
            high, low = limbs(unmask(sent, r, run["keys"], k, others), n)
            bits = 62 - int(np.ceil(np.log2(parties + 1)))  # one block per party
            plain = np.ldexp(high, bits) + low
            scale = 2.0 ** np.round(np.log2(np.abs(plain).max() / np.abs(truth).max()))
            np.testing.assert_allclose(plain / scale, truth, rtol=1e-15, atol=1e-15 * np.abs(truth).max())
            # One colluding party removes the masks it shares with party r: still masked.
            for q in others:
                for limb in limbs(unmask(sent, r, run["keys"], k, [q]), n):
                    assert r_squared(limb, truth) < 0.3
    # Across iterations, each component of a party's masked vectors is uncorrelated with its sums.
    for r in range(parties):
        series, truth = np.array(masked_series[r]), truths[r]  # (T, 2 limbs, n), (T, n)
        varying = np.flatnonzero(truth.std(axis=0) > 0)
        assert len(varying) > 50
        for limb in range(2):
            correlation = [np.corrcoef(series[:, limb, j], truth[:, j])[0, 1] for j in varying]
            assert np.mean(np.square(correlation)) < 3.0 / T


def received_arrays(value):
    """Every float64 array or float in a received message (arrays, lists, dicts), as a list of arrays.

    Counters and timings of the result's history (iteration, planes, seconds) are not data.
    """
    if isinstance(value, np.ndarray):
        return [value.ravel()] if value.dtype == np.float64 else []
    if isinstance(value, dict):
        value = [v for key, v in value.items() if key not in ("iteration", "planes") and
                 not key.startswith("seconds")]
    if isinstance(value, (list, tuple)):
        return [array for v in value for array in received_arrays(v)]
    return [np.array([value])] if isinstance(value, float) else []


def revealing(mine, total):
    """Where party sums `mine` are informative: nonzero, not the total itself (a feature only this
    party's rows have), not integers below 100 (flags and trial counts the protocol sends anyway)."""
    return ((mine != 0) & ~np.isclose(mine, total, rtol=1e-9, atol=0)
            & ~((np.abs(mine) < 100) & (mine == np.round(mine))))


# A value relayed is equal to a few ulps (divided by m at most); at 1e-9 the 1e8 comparisons of a
# long run would meet about one chance coincidence between unrelated numbers.
RELAYED = 1e-13


@pytest.mark.timeout(600)
@pytest.mark.parametrize("solver", PARTY_SOLVERS)
def test_no_received_value_is_one_partys_contribution(party_data, tmp_path, solver):
    """Every message each rank receives, for every solver party mode allows: no received array
    holds, at any position, the value one party's sums have there (as a sum or a mean), and no
    received value is one party's risk."""
    parties = 3
    completed = run_driver(parties, "transcript", party_data / str(parties), tmp_path / "t", solver,
                           timeout=480)
    assert completed.returncode == 0, completed.stderr[-3000:]
    runs = []
    for r in range(parties):
        with open(tmp_path / f"t-{r}.pickle", "rb") as f:
            runs.append(pickle.load(f))
    n_total = A9A_ROWS
    for q, run in enumerate(runs):
        # No maximum, minimum or gather: public broadcasts, masked sums and error checks only.
        assert {name for name, _, _ in run["records"]} <= {"bcast_object", "bcast_array", "allreduce_sum",
                                                          "check"}, solver
        received = [a for _, _, got in run["records"] for a in received_arrays(got)]
        values = np.sort(np.concatenate(received))
        for p in range(parties):
            if p == q:
                continue
            # Party p's sums, one row per secure sum (padded with NaN), where informative.
            width = max(len(mine) for mine in runs[p]["sums"])
            dim = min(len(mine) for mine in runs[p]["sums"]) - 1  # gradient sums; risks come after
            own = np.full((len(runs[p]["sums"]), width), np.nan)
            risks = []
            for k, mine in enumerate(runs[p]["sums"]):
                total = np.sum([runs[o]["sums"][k] for o in range(parties)], axis=0)
                informative = revealing(mine, total)
                own[k, :len(mine)] = np.where(informative, mine, np.nan)
                risks.extend(mine[dim:][informative[dim:]])
            for array in received:
                n = min(array.size, width)
                for scaled in (own[:, :n], own[:, :n] / n_total):
                    same = np.isclose(array[:n], scaled, rtol=RELAYED, atol=0)
                    assert not same.any(), (solver, q, p, scaled[same][:5])
            risks = np.concatenate([risks, np.divide(risks, n_total)])
            assert risks.size > 10
            at = np.clip(np.searchsorted(values, risks), 1, values.size - 1)
            nearest = np.minimum(np.abs(values[at] - risks), np.abs(values[at - 1] - risks))
            assert not (nearest <= RELAYED * np.abs(risks)).any(), (solver, q, p, risks[nearest <= RELAYED * np.abs(risks)])


# ---- Refusals --------------------------------------------------------------------------------------

@pytest.mark.distributed
def test_fewer_than_three_parties_are_refused(comm):
    if comm.size >= MIN_PARTIES:
        pytest.skip("refusal needs fewer than 3 ranks")
    with pytest.raises(UsageError, match=f"at least 3 parties, got {comm.size}.*subtracting its own"):
        SecureComm(comm)


def test_two_parties_are_refused_by_the_command_line(tmp_path):
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--parties", "--data", str(tmp_path / "s-{rank}"),
                                 "--out", str(tmp_path / "m-{rank}.h5")], timeout=60)
    assert completed.returncode == 2
    assert "secure aggregation needs at least 3 parties, got 2" in completed.stderr
    assert not list(tmp_path.glob("m-*.h5"))


NON_DECOMPOSABLE = sorted(name for name, cls in LOSSES.items() if not cls.decomposable)


def test_the_losses_that_send_scores_are_the_multivariate_ones():
    assert {"roc_area", "fbeta", "prbep", "ordinal", "preference"} <= set(NON_DECOMPOSABLE)


@pytest.mark.parametrize("loss", NON_DECOMPOSABLE)
def test_losses_that_send_scores_are_refused_unless_allowed(loss):
    class Secure:  # what check_loss needs of the communicator
        rank = 1

    # check_loss reads the loss's name and decomposable: the class has both.
    party = Party()
    party.comm = Secure()
    with pytest.raises(UsageError, match=f"loss '{loss}' is not decomposable: every iteration each "
                                         r"party's per-example scores .* --allow-score-sharing"):
        party.check_loss(LOSSES[loss])
    party = Party(allow_score_sharing=True)
    party.comm = Secure()
    with pytest.warns(UserWarning, match=r"party 1: .*scores f_i = <w, x_i> go to rank 0 unmasked"):
        assert party.check_loss(LOSSES[loss]) is LOSSES[loss]


def test_party_options_need_parties_and_differential_privacy_needs_both_values(tmp_path):
    from prbmrm.cli.train import build_parser, party_from_args

    def parse(*argv):
        return party_from_args(build_parser().parse_args(list(argv)))

    with pytest.raises(UsageError, match="--verify-coordinator needs --parties"):
        parse("--verify-coordinator")
    with pytest.raises(UsageError, match="--dp-epsilon needs --parties"):
        parse("--dp-epsilon", "1")
    with pytest.raises(UsageError, match="needs both --dp-epsilon and --dp-delta"):
        parse("--parties", "--data", "x-{rank}", "--dp-epsilon", "1")
    with pytest.raises(UsageError, match="--parties needs each party's data"):
        parse("--parties")
    with pytest.raises(UsageError, match="--model-to expects comma-separated"):
        parse("--parties", "--data", "x", "--model-to", "a,b")
    party = parse("--parties", "--data", "x", "--model-to", "2,1", "--no-audit-log")
    assert party.model_to == [1, 2] and party.audit_log is None
    assert party_path("site-{rank}.h5", 3) == "site-3.h5"
    assert party_path("/local/site.h5", 3) == "/local/site.h5"
    with pytest.raises(UsageError, match="not a path template"):
        party_path("site-{party}.h5", 0)


# ---- Secure sums on 3 ranks (distributed: the checks above run on 1 and 2) ---------------------

def secure(comm, **options):
    if comm.size < MIN_PARTIES:
        pytest.skip("secure aggregation needs 3 ranks")
    return SecureComm(comm, **options)


@pytest.mark.distributed
def test_secure_sums_equal_exact_sums(comm):
    from fractions import Fraction

    s = secure(comm)
    rng = np.random.default_rng(comm.rank)
    partials = rng.standard_normal((2, 50)) * 10.0 ** rng.integers(-3, 6, size=50)
    total = s.reproducible_sum(partials, 2 * comm.size)
    everyone = comm.gather_scalars(partials.ravel())
    counts = s.allreduce_sum(np.array([comm.rank + 1, -(2**40)], dtype=np.int64))
    if comm.is_root:
        rows = everyone.reshape(-1, 50)
        exact = np.array([float(sum(map(Fraction, rows[:, j]))) for j in range(50)])
        # The exact sum within about one ulp, after rounding each partial to the grid 2^(E - 2 bits).
        bits = 62 - int(np.ceil(np.log2(2 * comm.size + 1)))
        assert s.exponent == RESCALE_BITS * s.rescales and 2.0**s.exponent > np.abs(rows).max()
        grid = 2.0 ** (s.exponent - 2 * bits)
        assert np.all(np.abs(total - exact) <= 2 * np.spacing(np.abs(exact)) + len(rows) * grid)
        np.testing.assert_array_equal(counts, [comm.size * (comm.size + 1) // 2, -(2**40) * comm.size])


@pytest.mark.distributed
def test_overflows_are_detected_and_non_finite_values_reported(comm):
    s = secure(comm)
    partials = np.full((1, 3), 2.0**30 if comm.rank == 1 else 1.0)
    total = s.reproducible_sum(partials, comm.size)
    # Only party 1's values overflowed the range 2^0: the range grew to 2^32, in 4 rescales.
    assert (s.exponent, s.rescales) == (32, 4)
    np.testing.assert_array_equal(total, 2.0**30 + comm.size - 1)
    bad = np.array([[np.inf if comm.rank == 2 else 1.0, 0.0]])
    assert np.isnan(s.reproducible_sum(bad, comm.size)).all()
    with pytest.raises(CollectiveError, match="1 of the .* parties hold a value beyond"):
        s.allreduce_sum(np.array([2**62 - 1 if comm.rank == 0 else 0], dtype=np.int64))


@pytest.mark.distributed
def test_a_reported_deviation_stops_every_rank_and_hides_the_answer(comm):
    s = secure(comm)
    if comm.rank == 1:
        s.report_deviation(CoordinatorError("party 1 saw it"))
        with pytest.raises(CoordinatorError, match="party 1 saw it"):
            s.reproducible_sum(np.ones((1, 4)), comm.size)
    else:
        with pytest.raises(CollectiveError, match="party 1 stopped the run: it says that the coordinator deviated"):
            s.reproducible_sum(np.ones((1, 4)), comm.size)
    s.settle()  # reported once: the next collective passes


@pytest.mark.distributed
def test_each_party_loads_its_own_files_and_the_parties_agree(comm, mpi_tmp_path):
    s = secure(comm)
    rng = np.random.default_rng(0)
    sizes = [30 + 7 * r for r in range(comm.size)]
    if comm.is_root:
        for r, n in enumerate(sizes):
            y = np.ones(n) if r == 1 else np.where(rng.random(n) < 0.5, 1.0, -1.0)  # party 1: one class
            write_shards(rng.standard_normal((n, 5)), y, mpi_tmp_path / f"site-{r}", 1 + r % 2)
            write_shards(rng.standard_normal((n, 5 + (r == 2))), y, mpi_tmp_path / f"odd-{r}", 1)
    comm.barrier()
    local = load_party(str(mpi_tmp_path / "site-{rank}"), s)
    assert local.files and all(os.path.dirname(f) == str(mpi_tmp_path / f"site-{comm.rank}")
                               for f in local.files)
    assert local.n_local == sizes[comm.rank] and local.n_examples_total == sum(sizes)
    assert local.label_kind == "binary"
    np.testing.assert_array_equal(local.classes, [-1.0, 1.0])
    with pytest.raises(CollectiveError, match="parties disagree on the number of features: party 0 has "
                                              "5, party 2 has 6"):
        load_party(str(mpi_tmp_path / "odd-{rank}"), s)


@pytest.mark.parametrize("kinds, kind, classes", [
    ([("binary", [-1, 1]), ("integer", [1])], "binary", [-1, 1]),
    ([("binary", [1, 3]), ("integer", [1, 2, 3])], "integer", [1, 2, 3]),
    ([("integer", [1, 2]), ("real", None)], "real", None),
    ([("multilabel", [0, 1, 2]), ("multilabel", [0, 1, 2])], "multilabel", [0, 1, 2])])
def test_label_kinds_of_the_parties_combine_through_their_values(kinds, kind, classes):
    from prbmrm.party.session import _disagreement, _label_union

    shared = [({"d": 3, "kind": k, "has_qid": False}, None if c is None else np.array(c, dtype=float))
              for k, c in kinds]
    assert _disagreement(shared) is None
    found_kind, found = _label_union(shared)
    assert found_kind == kind and (found is None if classes is None else found.tolist() == classes)


def test_parties_must_share_label_sets_and_targets():
    from prbmrm.party.session import _disagreement

    shared = [({"d": 3, "kind": "multilabel", "has_qid": False}, np.array([0.0, 1.0])),
              ({"d": 3, "kind": "multilabel", "has_qid": False}, np.array([0.0, 2.0]))]
    assert "parties disagree on the columns of y" in str(_disagreement(shared))
    shared[1] = ({"d": 3, "kind": "binary", "has_qid": False}, np.array([-1.0, 1.0]))
    assert "parties disagree on the label kind" in str(_disagreement(shared))


# ---- Coordinator check and audit log ---------------------------------------------------------------

def privacy_config(tmp_path, name, data, **extra):
    """A configuration file of a 3-party run on `data` (TOML text of the [privacy] data key)."""
    path = tmp_path / f"{name}.toml"
    lines = [f"{key} = {value}" for key, value in extra.items()]
    path.write_text(f'bias = true\nlam = 3e-3\nquiet = true\nout = "{tmp_path}/{name}-{{rank}}.h5"\n\n'
                    f'[privacy]\nparties = true\ndata = {data}\n' + "".join(line + "\n" for line in lines))
    return str(path)


@pytest.mark.timeout(300)
def test_a_config_file_trains_the_model_of_the_flags(party_data, tmp_path):
    """The [privacy] table (one path per party) gives the model of the flags (a --data template)."""
    sites = party_data / "3"
    completed, _ = run_ranks(3, [
        "-m", "prbmrm.cli.train", "--parties", "--data", f"{sites}/a9a-site-{{rank}}", "--bias", "--lam", "3e-3",
        "--quiet", "--model-to", "0,2", "--verify-coordinator", "--audit-log", f"{tmp_path}/flags-{{rank}}.jsonl",
        "--out", f"{tmp_path}/flags-{{rank}}.h5"], timeout=120)
    assert completed.returncode == 0, completed.stderr
    config = privacy_config(tmp_path, "config", json.dumps([f"{sites}/a9a-site-{r}" for r in range(3)]),
                            model_to="[0, 2]", verify_coordinator="true",
                            audit_log=f'"{tmp_path}/config-{{rank}}.jsonl"')
    completed, _ = run_ranks(3, ["-m", "prbmrm.cli.train", "--config", config], timeout=120)
    assert completed.returncode == 0, completed.stderr
    for name in ("flags", "config"):
        assert sorted(path.name for path in tmp_path.glob(f"{name}-*.h5")) == [f"{name}-0.h5", f"{name}-2.h5"]
        assert len(list(tmp_path.glob(f"{name}-*.jsonl"))) == 3
    for r in (0, 2):
        flags, configured = (load_model(str(tmp_path / f"{name}-{r}.h5")) for name in ("flags", "config"))
        np.testing.assert_array_equal(configured.w, flags.w)
        assert configured.bias == flags.bias and configured.attrs["parties"] == 3
        for key in ("objective", "iterations", "verify_coordinator"):
            assert configured.attrs[key] == flags.attrs[key], key


@pytest.mark.timeout(120)
def test_a_config_file_needs_one_data_path_per_party(party_data, tmp_path):
    sites = json.dumps([str(party_data / "3" / f"a9a-site-{r}") for r in range(2)])
    completed, _ = run_ranks(3, ["-m", "prbmrm.cli.train", "--config", privacy_config(tmp_path, "two", sites)],
                             timeout=60)
    assert completed.returncode == 2
    errors = [line for line in completed.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert "one data path per party (--party-data, or the [privacy] table's data): got 2 for 3 parties" in errors[0]
    assert not list(tmp_path.glob("two-*.h5"))


def test_a_deviating_coordinator_is_caught_by_every_party(party_data, tmp_path):
    parties, evaluation = 4, 5
    directory = party_data / str(parties)
    completed = run_driver(parties, "perturb", evaluation, "--parties", "--data",
                           f"{directory}/a9a-site-{{rank}}", "--verify-coordinator", "--bias",
                           "--lam", "1e-3", "--audit-log", f"{tmp_path}/audit-{{rank}}.jsonl",
                           "--out", f"{tmp_path}/model-{{rank}}.h5", "--quiet")
    assert completed.returncode == 2, completed.stderr
    for r in range(1, parties):
        assert re.search(rf"prbmrm.cli.train: error \(party {r}\): the coordinator deviated from the "
                         rf"protocol: at evaluation {evaluation} the w it sent differs from the one the "
                         r"solver prescribes by [0-9.e-]+", completed.stderr), completed.stderr
    # Rank 0 names the parties that stopped the run: no anonymous blame.
    assert "error: party 1, 2, 3 stopped the run: they say that the coordinator deviated" in completed.stderr
    assert not list(tmp_path.glob("model-*.h5"))
    for r in range(parties):
        lines = [json.loads(line) for line in open(tmp_path / f"audit-{r}.jsonl")]
        # Detected at the deviating query itself (noted in the log): no party answered another one.
        queries = [line["query"] for line in lines if "query" in line]
        assert queries == list(range(1, evaluation + 1))
        assert lines[-1]["summary"]["queries"] == evaluation
        deviations = [line["deviation"] for line in lines if "deviation" in line]
        assert len(deviations) == (r > 0) and all(f"at evaluation {evaluation}" in d for d in deviations)


class Requests:
    """The oracle a CoordinatorCheck wraps, answering with a fixed plane: rank 0 sends `sent` in turn."""

    last_seconds = {"risk": 0.0, "comm": 0.0}

    def __init__(self, *sent):
        self.sent = list(sent)

    def receive(self):
        return self.sent.pop(0)

    def answer(self):
        return 0.5, np.ones(2)


class Reports:
    """The communicator a CoordinatorCheck reports to."""

    rank = 1
    reported = None

    def report_deviation(self, error):
        self.reported = str(error)


def test_the_coordinator_check_finds_each_kind_of_deviation():
    from prbmrm.party.session import CoordinatorCheck, _Stopped

    w = np.array([1.0, -2.0])
    comm = Reports()
    check = CoordinatorCheck(Requests(w * (1 + 1e-12), None), comm, 1e-9)
    assert check(w) == (0.5, pytest.approx(np.ones(2))) and comm.reported is None  # round-off
    check.finish()  # rank 0 stops when the solver does
    assert comm.reported is None
    check = CoordinatorCheck(Requests(w + [0.0, 1e-6]), comm, 1e-9)
    check(w)
    assert re.search(r"deviated from the protocol: at evaluation 1 the w it sent differs .* by 1e-06 "
                     r"\(max \|w\| 2, tolerance 1e-09 relative\) \(party 1 ", comm.reported)
    comm = Reports()
    with pytest.raises(_Stopped):
        CoordinatorCheck(Requests(None), comm, 1e-9)(w)
    assert "it stopped after 0 evaluations, where the solver asks for another one" in comm.reported
    comm = Reports()
    CoordinatorCheck(Requests(w), comm, 1e-9).finish()
    assert "it asked for evaluation 1 after the solver stopped" in comm.reported


def test_audit_log_records_every_query_and_the_trend(tmp_path):
    X = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    y = np.array([1.0, -1.0, 1.0])
    loss, reg, lam = get_loss("hinge"), get_regularizer("l2"), 0.1
    log = AuditLog(str(tmp_path / "a.jsonl"), 2, len(y), lam, reg, True, {"parties": 3})
    points = [np.zeros(2), np.array([3.0, -3.0]), np.array([0.5, -0.5])]
    for w in points:
        risk, gradient = loss.loss_gradient(w, X, y)
        log(w, np.array([[*gradient, risk]]))
    summary = log.close()
    lines = [json.loads(line) for line in open(tmp_path / "a.jsonl")]
    assert lines[0]["party"] == 2 and lines[0]["rows"] == 3
    objectives = [lam * w @ w / 2 + np.mean(np.maximum(0, 1 - y * (X @ w))) for w in points]
    for line, w, objective in zip(lines[1:-1], points, objectives):
        assert line["w"] == w.tolist()
        assert line["local_objective"] == pytest.approx(objective, rel=1e-14)
    assert summary == lines[-1]["summary"]
    assert summary["queries"] == 3 and summary["queries_above_first"] == 1
    assert summary["decreasing"] == (objectives[-1] < objectives[0])


# ---- Differential privacy --------------------------------------------------------------------------

def per_example_reference(loss, X, y, w):
    """Each example's (loss, gradient) by itself, with the loss's own one-row evaluation."""
    rows = []
    for i in range(X.shape[0]):
        risk, gradient = loss.loss_gradient(w, X[i:i + 1], y[i:i + 1])
        rows.append(np.concatenate([[risk], gradient]))
    return np.array(rows)


@pytest.mark.parametrize("name", ["hinge", "logistic", "multiclass_hinge"])
def test_clipping_bounds_each_examples_contribution(name):
    X, y = load_svmlight("dna.scale.xz")
    X, y = X[:200], y[:200] if name == "multiclass_hinge" else np.where(y[:200] == 3, 1.0, -1.0)
    loss = get_loss(name)
    loss.prepare(np.unique(y), "integer" if name == "multiclass_hinge" else "binary")
    w = np.random.default_rng(0).normal(size=X.shape[1] * loss.n_outputs) * 0.3
    rows = per_example_reference(loss, X, y, w)
    norms = np.linalg.norm(rows, axis=1)
    clip = np.median(norms[norms > 0])
    scale = np.where(norms > clip, clip / np.where(norms > 0, norms, 1.0), 1.0)
    expected = (rows * scale[:, None]).sum(axis=0)
    risk, gradient = ClippedLoss(loss, clip).loss_gradient(w, X, y)
    np.testing.assert_allclose(np.concatenate([[risk], gradient]), expected, rtol=1e-12, atol=1e-12)
    # A clip above every norm changes nothing.
    risk, gradient = ClippedLoss(loss, 2 * norms.max()).loss_gradient(w, X, y)
    np.testing.assert_allclose(np.concatenate([[risk], gradient]), rows.sum(axis=0), rtol=1e-12, atol=1e-12)


def test_noise_is_standard_normal():
    from scipy import stats

    z = gaussian_noise(bytes(range(32)), 7, 20000)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert not np.array_equal(z, gaussian_noise(bytes(range(32)), 8, 20000))


def test_keystream_is_rfc8439_chacha20():
    # RFC 8439, 2.4.2: key 00..1f, nonce 00:00:00:00:00:00:00:4a:00:00:00:00, block counter 1,
    # which is the stream from block counter 0 (ours) after its first 64 bytes.
    nonce = int.from_bytes(bytes.fromhex("000000000000004a00000000"), "little")
    stream = keystream(bytes(range(32)), nonce, 16).tobytes()[64:]
    plaintext = b"Ladies and Gentlemen of the class of '99: If I could offer you o"
    assert bytes(p ^ k for p, k in zip(plaintext, stream)).hex() == (
        "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"
        "f91b65c5524733ab8f593dabcd62b3571639d624e65152ab8f530c359f0861d8")


@pytest.mark.parametrize("parties", [3, 4, 5, 8])
def test_the_noise_shares_hold_the_target_against_any_coalition(parties):
    """A coalition of T parties subtracts its own T shares: the others' still give epsilon = target."""
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import RdpAccountant

    from prbmrm.party.privacy import PrivacyBudget

    epsilon, delta, evaluations, clip = 1.0, 1e-5, 40, 4.0
    budget = PrivacyBudget(epsilon, delta, evaluations)

    def against(coalition, share):
        # The noise the coalition cannot remove: the P - T other shares, independent Gaussians.
        remaining = share * math.sqrt(parties - coalition) / clip
        accountant = RdpAccountant()
        accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(remaining),
                                                             evaluations))
        return accountant.get_epsilon(delta)

    for target in range(parties):  # the option T
        share = budget.share(clip, parties, target)
        for coalition in range(target + 1):  # every coalition of up to T parties
            spent = against(coalition, share)
            assert spent <= epsilon * (1 + 1e-6)
            if coalition == target:
                assert spent == pytest.approx(epsilon, rel=1e-4)
    if parties > 3:
        # The former shares (sigma C / sqrt(P - 1)) fall short against the default coalition of P - 2.
        assert against(parties - 2, budget.noise_multiplier * clip / math.sqrt(parties - 1)) > 1.2 * epsilon


@pytest.mark.parametrize("parties", [3, 4])
def test_differential_privacy_trains_and_saves_the_budget_spent(tmp_path, parties):
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import RdpAccountant

    from prbmrm.distributed.comm import SerialComm
    from prbmrm.training import run

    max_iter, epsilon, delta = 40, 1.0, 1e-5
    X, y = load_svmlight("a9a.xz", 123)
    X_test, y_test = load_svmlight("a9a.t.xz", 123)
    bounds = split_rows(len(y), parties, seed=1)
    for r in range(parties):
        write_shards(X[bounds[r]:bounds[r + 1]], y[bounds[r]:bounds[r + 1]], tmp_path / f"site-{r}", 1)
    completed, _ = run_ranks(parties, [
        "-m", "prbmrm.cli.train", "--parties", "--data", f"{tmp_path}/site-{{rank}}", "--bias", "--lam", "1e-3",
        "--max-iter", str(max_iter), "--solver", "proximal", "--dp-epsilon", str(epsilon), "--dp-delta",
        str(delta), "--dp-clip", "4", "--no-audit-log", "--model-to", "0",
        "--out", f"{tmp_path}/dp-{{rank}}.h5"],
        timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert [path.name for path in tmp_path.glob("dp-*.h5")] == ["dp-0.h5"]  # --model-to 0
    first = completed.stdout.splitlines()
    assert first[0].endswith("; takes all 40 iterations; solver proximal (as given)")  # what the run does
    assert "the lower bound is NOT certified" in first[1]
    model = load_model(str(tmp_path / "dp-0.h5"))
    attrs = model.attrs
    assert attrs["lower_bound_certified"] is False
    # The accountant's epsilon, recomputed for the evaluations made and the noise multiplier saved.
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(
        attrs["dp_noise_multiplier"]), attrs["dp_evaluations"]))
    assert attrs["dp_evaluations"] == attrs["iterations"] == max_iter  # no gap test under noise
    assert attrs["dp_epsilon"] == pytest.approx(accountant.get_epsilon(delta), rel=1e-9)
    assert attrs["dp_epsilon"] <= epsilon * (1 + 1e-6) and attrs["dp_delta"] == delta
    assert attrs["dp_coalition"] == parties - 2  # the default: what secure aggregation resists
    assert (f"spent epsilon {attrs['dp_epsilon']:.4g} (target 1) against any coalition of up to "
            f"{parties - 2} parties") in completed.stdout
    # It still learns: accuracy on a9a.t next to the non-private model's.
    plain, _, _ = run((X, y), bias=True, lam=1e-3, comm=SerialComm())
    accuracy = {}
    for kind, w, b in (("private", model.w, model.bias), ("non-private", plain.w[:-1], plain.w[-1])):
        accuracy[kind] = np.mean(np.where(X_test @ w + b >= 0, 1.0, -1.0) == y_test)
    print(f"\na9a.t accuracy, {parties} parties: differentially private (epsilon {attrs['dp_epsilon']:.3g}, "
          f"delta {delta:g}, coalitions of up to {parties - 2}) "
          f"{accuracy['private']:.4f}, non-private {accuracy['non-private']:.4f}")
    assert accuracy["private"] >= accuracy["non-private"] - 0.03, accuracy
