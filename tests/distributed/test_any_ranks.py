"""Any rank count, bitwise: one set of 2 shard files trains to the same bits on 1, 2, 3 and 5 ranks, and a
checkpoint written on 5 ranks resumes on 3 (and on 2) to the bits of the uninterrupted 1-rank run; so do checkpoints of
dcd and TRON written on 1, 2 or 3 ranks and resumed on as many or another count.

The canonical blocks do not depend on the rank count (:func:`prbmrm.io.load_local`), their sums are added
exactly (:mod:`prbmrm.distributed.exact`), and the checkpoint keeps the sums' fixed-point bounds. 24 and 64
ranks (too slow for the suite on 2 cores) were checked by hand the same way (see docs/cluster.md).
"""

import numpy as np
import pytest

from helpers import load_svmlight, run_ranks
from prbmrm.checkpoint import SUM_BOUNDS, load_checkpoint
from prbmrm.io import write_shards
from prbmrm.model import load_model

RUN = ["-m", "prbmrm.cli.train", "--loss", "hinge", "--lam", "1e-4", "--solver", "bmrm", "--quiet"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("any_ranks")
    X, y = load_svmlight("a9a.xz", 123)
    write_shards(X[:8000], y[:8000], root / "a9a", 2)
    return str(root / "a9a" / "*.h5")


def train(shards, ranks, out, *options):
    completed, _ = run_ranks(ranks, [*RUN, "--data", shards, "--out", str(out), *options], timeout=300)
    assert completed.returncode == 0, completed.stderr
    return load_model(str(out))


@pytest.fixture(scope="module")
def serial(shards, tmp_path_factory):
    return train(shards, 1, tmp_path_factory.mktemp("serial") / "m1.h5")


@pytest.mark.parametrize("ranks", [2, 3, 5])
def test_models_are_bitwise_equal_on_any_rank_count(shards, serial, tmp_path, ranks):
    model = train(shards, ranks, tmp_path / "m.h5")
    np.testing.assert_array_equal(model.w, serial.w)
    np.testing.assert_array_equal(model.history["objective"], serial.history["objective"])


@pytest.mark.parametrize("resumed_on", [3, 2])
def test_a_checkpoint_written_on_5_ranks_resumes_on_another_count_to_the_same_bits(shards, serial, tmp_path,
                                                                                     resumed_on):
    path = tmp_path / "state.h5"
    train(shards, 5, tmp_path / "part.h5", "--max-iter", "25", "--checkpoint", str(path))
    state, meta = load_checkpoint(str(path))
    assert meta["iteration"] == 25 and state[SUM_BOUNDS].shape == (serial.w.size + 1,)
    resumed = train(shards, resumed_on, tmp_path / "resumed.h5", "--resume", str(path))
    assert resumed.attrs["iterations"] == serial.attrs["iterations"] > 25
    np.testing.assert_array_equal(resumed.w, serial.w)


NEWTON_OR_DUAL = {"dcd": ["--solver", "dcd"],
                  "tron": ["--solver", "tron", "--loss", "logistic", "--rel-epsilon", "1e-8"]}


@pytest.fixture(scope="module")
def serial_of(shards, tmp_path_factory):
    """The uninterrupted 1-rank run of each solver of :data:`NEWTON_OR_DUAL`."""
    directory = tmp_path_factory.mktemp("serial_of")
    return {name: train(shards, 1, directory / f"{name}.h5", *options) for name, options in NEWTON_OR_DUAL.items()}


@pytest.mark.parametrize("solver", sorted(NEWTON_OR_DUAL))
@pytest.mark.parametrize("written_on, resumed_on", [(1, 1), (2, 2), (3, 3), (2, 3), (3, 1)])
def test_dcd_and_tron_resume_on_any_rank_count_to_the_same_bits(shards, serial_of, tmp_path, solver, written_on,
                                                                 resumed_on):
    serial, path = serial_of[solver], tmp_path / "state.h5"
    train(shards, written_on, tmp_path / "part.h5", *NEWTON_OR_DUAL[solver], "--max-iter", "3", "--checkpoint",
          str(path))
    assert load_checkpoint(str(path))[1]["iteration"] == 3 < serial.attrs["iterations"]
    resumed = train(shards, resumed_on, tmp_path / "resumed.h5", *NEWTON_OR_DUAL[solver], "--resume", str(path))
    assert resumed.attrs["iterations"] == serial.attrs["iterations"] and solver in resumed.attrs["solver"]
    np.testing.assert_array_equal(resumed.w, serial.w)
    for column in ("objective", "best_objective", "lower_bound", "gap"):
        np.testing.assert_array_equal(resumed.history[column], serial.history[column])
