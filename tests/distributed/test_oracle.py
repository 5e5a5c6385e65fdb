"""The risk oracle's own arrays (:class:`prbmrm.distributed.oracle.DistributedRisk`): the sums written over the
first block's partials, and the subgradient scaled in place in them, give the bits of fresh arrays."""

import numpy as np
import scipy.sparse as sp

from prbmrm.distributed.comm import SerialComm
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.losses import get_loss


def test_the_oracles_own_out_gives_the_bits_of_a_fresh_array_and_the_observer_sees_the_partials():
    rng = np.random.default_rng(0)
    X = sp.random(300, 50, density=0.2, random_state=0, format="csr")
    y = np.where(rng.random(300) < 0.5, 1.0, -1.0)
    bounds = [0, 100, 180, 300]
    own = DistributedRisk(get_loss("hinge"), X, y, 300, SerialComm(), bounds)
    fresh = DistributedRisk(get_loss("hinge"), X, y, 300, SerialComm(), bounds)
    seen = []
    own.observer = lambda w, partials: seen.append(np.array(partials))
    for seed in range(3):
        w = np.random.default_rng(seed).normal(size=50)
        r, a = own(w, out=own.subgradient_out)
        r_fresh, a_fresh = fresh(w)
        assert a is own.subgradient_out or np.shares_memory(a, own.subgradient_out)
        assert r == r_fresh
        np.testing.assert_array_equal(a, a_fresh)
        # The partials the observer saw are the blocks' own sums, which numpy adds up to about the same.
        blocks = [get_loss("hinge").loss_gradient(w, X[s:t], y[s:t], None) for s, t in zip(bounds[:-1], bounds[1:])]
        np.testing.assert_allclose(seen[-1][:, -1], [risk for risk, _ in blocks], rtol=1e-12)
        np.testing.assert_allclose(seen[-1][:, :-1], [g.ravel() for _, g in blocks], rtol=1e-12, atol=1e-15)
