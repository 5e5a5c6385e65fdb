"""Structured models trained by BMRM: graph matching (paper 000 Sec. 5.3.2, Fig. 11) and chain labeling.

(a) Graph matching on synthetic point sets (``make_matching_data``): held-out
    matching error (mean normalized Hamming, eq. 20) of the weights learned
    with L2 and with L1 regularization, against the uniform weights w = 1 of
    the standard cost, and the number of nonzero weights (L1 is sparser).
(b) Chain labeling: test Hamming accuracy of the max-margin chain model
    (BMRM, Viterbi) and the logistic chain model (L-BFGS, forward-backward)
    against per-position multiclass models that see the same features but no
    transitions (prbmrm's ``multiclass_hinge`` and ``softmax`` on the
    positions as independent rows). Each model's lam is chosen on a
    validation split. On synthetic HMM sequences (``make_chain_data``) and,
    if the package ``hironsancorpus`` is installed (``pip install
    hironsancorpus``: a 500-sentence Japanese named-entity corpus, IOB2 tags),
    on real sentences.

Timings are wall-clock seconds on a shared machine; iteration counts are the
robust figure. Run: ``PYTHONPATH=$PWD python scripts/bench_structured.py``.
"""

import importlib.resources
import importlib.util
import time

import numpy as np
import scipy.sparse as sp

from prbmrm.distributed.comm import SerialComm
from prbmrm.losses import get_loss
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.solvers import minimize
from prbmrm.structured import (ChainModel, MatchingModel, RaggedExamples, StructuredLoss, make_chain_data,
                               make_matching_data)

MATCHING_GROUPS = {"sizes": (4, 4, 12), "noise": (0.5, 1.0, 10.0)}


def train(loss, X, y, lam, reg="l2", method="bmrm"):
    """Return ``(result, seconds)`` of minimizing lam Omega(w) + R_emp(w) through a serial risk oracle."""
    risk = DistributedRisk(loss, X, y, len(y), SerialComm())
    started = time.perf_counter()
    result = minimize(risk, np.zeros(risk.dim), lam, method=method, reg=reg, max_iter=2000)
    return result, time.perf_counter() - started


def train_structured(model, form, data, lam, reg="l2", method="bmrm"):
    # The labels live in `data`; the oracle's y is only sliced alongside it.
    return train(StructuredLoss(model, form), data, np.zeros(len(data)), lam, reg, method)


def matching_error(model, data, w):
    return float(np.mean([model.delta(y, model.predict(x, w)) for x, y in data]))


def bench_matching(n_train=40, n_test=200, n_points=20, lams=(0.1, 1.0, 3.0, 10.0)):
    sizes, noise = MATCHING_GROUPS["sizes"], MATCHING_GROUPS["noise"]
    data = make_matching_data(n_train + n_test, n_points=n_points, group_sizes=sizes, group_noise=noise, seed=0)
    train_data, test = data[:n_train], data[n_train:]
    model = MatchingModel()
    groups = np.repeat(np.arange(len(sizes)), sizes)
    print(f"\n### (a) Graph matching: {n_train} training / {n_test} test pairs of {n_points} points, "
          f"{len(groups)} features in groups of sizes {sizes} with noise {noise}\n")
    print("| weights | lam | BMRM iterations | seconds | nonzeros of w | nonzeros per group | "
          "test matching error |")
    print("|---|---|---|---|---|---|---|")
    uniform = np.ones(len(groups))
    print(f"| uniform (w = 1) | - | - | - | {len(groups)} | {'/'.join(map(str, sizes))} | "
          f"{matching_error(model, test, uniform):.4f} |")
    for reg in ("l2", "l1"):
        for lam in lams:
            result, seconds = train_structured(model, "margin", train_data, lam, reg)
            nonzero = result.w != 0
            per_group = "/".join(str(int(nonzero[groups == g].sum())) for g in range(len(sizes)))
            print(f"| learned, {reg.upper()} | {lam:g} | {result.nit} | {seconds:.1f} | {int(nonzero.sum())} | "
                  f"{per_group} | {matching_error(model, test, result.w):.4f} |")


def chain_accuracy(model, data, w):
    return float(np.mean(np.concatenate([model.predict(x, w) == y for x, y in data])))


def bench_chain(title, data, n_states, splits, lams):
    """Print the chain models and the per-position baselines on `data` split into train/validation/test."""
    a, b = splits
    train_data, validation, test = data[:a], data[a:b], data[b:]
    model = ChainModel(n_states)
    majority = np.mean(test.y_values == np.bincount(train_data.y_values).argmax())
    print(f"\n### (b) Chain labeling, {title}: {n_states} states, {data.shape[1]} features per position, "
          f"{len(train_data)}/{len(validation)}/{len(test)} sequences "
          f"({len(train_data.y_values)}/{len(validation.y_values)}/{len(test.y_values)} positions) "
          f"for training/validation/test; the most frequent state has test accuracy {majority:.4f}\n")
    print("| model | solver | lam | iterations | seconds | validation accuracy | test Hamming accuracy |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for name, form, method in (("max-margin chain (Viterbi)", "margin", "bmrm"),
                               ("logistic chain (forward-backward)", "logistic", "lbfgs")):
        for lam in lams["chain"]:
            result, seconds = train_structured(model, form, train_data, lam, method=method)
            rows.append((name, method, lam, result.nit, seconds, chain_accuracy(model, validation, result.w),
                         chain_accuracy(model, test, result.w)))
    classes = np.arange(n_states, dtype=np.float64)
    for name, loss_name, method in (("per-position multiclass_hinge", "multiclass_hinge", "bmrm"),
                                    ("per-position softmax", "softmax", "lbfgs")):
        for lam in lams["position"]:
            loss = get_loss(loss_name)
            loss.prepare(classes, "integer")
            # CSR: the one-hot features of real sentences are sparse.
            result, seconds = train(loss, sp.csr_matrix(train_data.x_values),
                                    train_data.y_values.astype(np.float64), lam, method=method)

            def accuracy(split):
                return float(np.mean(np.argmax(loss.scores(split.x_values, result.w), axis=1) == split.y_values))

            rows.append((name, method, lam, result.nit, seconds, accuracy(validation), accuracy(test)))
    best = {}
    for row in rows:
        if row[0] not in best or row[5] > best[row[0]][5]:
            best[row[0]] = row
    for row in rows:
        mark = " **(best on validation)**" if best[row[0]] is row else ""
        print(f"| {row[0]} | {row[1]} | {row[2]:g} | {row[3]} | {row[4]:.1f} | {row[5]:.4f} | {row[6]:.4f}{mark} |")


def hironsan_sentences():
    """Return the hironsancorpus sentences as ``(RaggedExamples, tag names)``, or None if not installed.

    Each token is described by one-hot codes of its character type, part of
    speech and part-of-speech subclass, for itself and its two neighbours,
    plus a constant feature; its state is its IOB2 tag.
    """
    if importlib.util.find_spec("hironsan") is None:
        return None
    text = (importlib.resources.files("hironsan.corpus") / "iob_sents.txt").read_text(encoding="utf-8")
    sentences = [[line.split("\t") for line in block.splitlines()] for block in text.split("\n\n")
                 if block.strip()]
    fields = [sorted({token[column] for sentence in sentences for token in sentence}) for column in (1, 2, 3)]
    tags = sorted({token[-1] for sentence in sentences for token in sentence})
    width = sum(len(values) for values in fields)
    xs, ys = [], []
    for sentence in sentences:
        codes = np.zeros((len(sentence) + 2, width))  # one padding row each side
        for t, token in enumerate(sentence, start=1):
            offset = 0
            for column, values in zip((1, 2, 3), fields):
                codes[t, offset + values.index(token[column])] = 1.0
                offset += len(values)
        xs.append(np.hstack([codes[1:-1], codes[:-2], codes[2:], np.ones((len(sentence), 1))]))
        ys.append(np.array([tags.index(token[-1]) for token in sentence], dtype=np.int64))
    return RaggedExamples.from_lists(xs, ys, 3 * width + 1), tags


def main():
    print("## Structured models trained by BMRM (serial risk oracle; timings under load)")
    bench_matching()
    synthetic = make_chain_data(600, n_states=5, n_features=8, lengths=(10, 30), stay=0.8, noise=1.5, seed=0)
    bench_chain("synthetic HMM (stay 0.8, emission noise 1.5)", synthetic, 5, (200, 300),
                {"chain": (0.03, 0.3, 3.0), "position": (1e-3, 1e-2, 1e-1)})
    real = hironsan_sentences()
    if real is None:
        print("\n(hironsancorpus is not installed: `pip install hironsancorpus` adds the real sentences)")
    else:
        data, tags = real
        n = len(data)
        bench_chain("hironsancorpus (Japanese named entities, IOB2)", data, len(tags),
                    (int(0.6 * n), int(0.8 * n)), {"chain": (0.03, 0.3), "position": (3e-4, 3e-3)})


if __name__ == "__main__":
    main()
