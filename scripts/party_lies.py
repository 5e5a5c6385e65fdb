"""Measure the bounded lies the poisoning guard does and does not catch (the table of docs/party.md).

    PRBMRM_DATA=/work/shared/data python scripts/party_lies.py [SCENARIO ...]

Each scenario runs ``prbmrm.cli.train --parties`` on 3 ranks through tests/party/hostile_ranks.py
(``scale:FACTOR:START``: party 2 multiplies every sum it sends by FACTOR from its evaluation START on;
``honest``), on the first 3,000 rows of a9a split 900 / 1,200 / 900, hinge, ``--bias --lam 1e-3``, and
prints the exit status, the first error line, or the iterations, the accuracy on a9a.t and
``|w - w_honest| / |w_honest|``.
"""

import os
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from helpers import load_svmlight, run_ranks  # noqa: E402
from prbmrm.io import write_shards  # noqa: E402
from prbmrm.model import load_model  # noqa: E402

SCENARIOS = ["honest", "scale:0.5:4", "scale:2:3", "scale:0.5:3", "scale:0.9:3", "scale:0.5:1", "scale:2:1"]


def main(scenarios):
    root = tempfile.mkdtemp(prefix="party-lies-")
    X, y = load_svmlight("a9a.xz", 123)
    Xt, yt = load_svmlight("a9a.t.xz", 123)
    bounds = [0, 900, 2100, 3000]
    for r in range(3):
        write_shards(X[bounds[r]:bounds[r + 1]], y[bounds[r]:bounds[r + 1]], f"{root}/site-{r}", 1)
    driver = os.path.join(REPO, "tests", "party", "hostile_ranks.py")
    honest = None
    for scenario in ["honest"] + [s for s in scenarios if s != "honest"]:
        completed, _ = run_ranks(3, [driver, scenario, "2", f"{root}/marker", "--parties", "--data",
                                     f"{root}/site-{{rank}}", "--bias", "--lam", "1e-3", "--quiet", "--no-audit-log",
                                     "--out", f"{root}/{scenario}-{{rank}}.h5"], timeout=600)
        if completed.returncode != 0:
            print(f"{scenario}: exit {completed.returncode}: {completed.stderr.strip().splitlines()[-1][:200]}")
            continue
        model = load_model(f"{root}/{scenario}-0.h5")
        w = model.w
        accuracy = np.mean(np.where(Xt[:, :len(w)] @ w + model.bias >= 0, 1.0, -1.0) == yt)
        honest = w if honest is None else honest
        print(f"{scenario}: exit 0, {len(model.history['iteration'])} iterations, accuracy {accuracy:.4f}, "
              f"|w - w_honest| / |w_honest| = {np.linalg.norm(w - honest) / np.linalg.norm(honest):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:] or SCENARIOS)
