"""Any rank count, bitwise: one set of 2 shard files trains to the same bits on 1, 2, 3 and 5 ranks, and a
checkpoint written on 5 ranks resumes on 3 (and on 2) to the bits of the uninterrupted 1-rank run.

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
