"""The products of the non-decomposable losses (prbmrm.kernels.blocks.block_scores and block_gradients)
against scipy's and numpy's per block: bitwise the same on CSR rows (the compiled loops) and on the others.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from prbmrm.kernels.blocks import block_gradients, block_scores, row_block
from prbmrm.kernels.sparse import compiled_rows


@pytest.mark.parametrize("kind", ["int32", "int64", "mixed", "dense"])
def test_block_products_are_scipys_per_block(kind):
    rng = np.random.default_rng(0)
    X = sp.random(500, 40, density=0.2, random_state=1, format="csr")
    if kind == "int64":
        X.indices, X.indptr = X.indices.astype(np.int64), X.indptr.astype(np.int64)
    elif kind == "mixed":
        X.indptr = X.indptr.astype(np.int64)
    elif kind == "dense":
        X = X.toarray()
    assert compiled_rows(X) == (kind in ("int32", "int64"))
    bounds = np.array([0, 7, 7, 180, 500])
    blocks = [(row_block(X, a, b), None, None) for a, b in zip(bounds[:-1], bounds[1:])]
    w, v = rng.normal(size=40), rng.normal(size=500)
    np.testing.assert_array_equal(block_scores(X, blocks, w), np.concatenate([B @ w for B, _, _ in blocks]))
    partials = np.full((len(blocks), 41), np.nan)
    block_gradients(X, blocks, bounds, v, partials)
    for partial, (B, _, _), a, b in zip(partials, blocks, bounds[:-1], bounds[1:]):
        np.testing.assert_array_equal(partial[:-1], B.T @ v[a:b])
        assert np.isnan(partial[-1])  # the risk column is the caller's
