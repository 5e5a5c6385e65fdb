"""Build prbmrm/_data/breast_cancer.npz, the embedded demo data set.

The Wisconsin diagnostic breast cancer data (UCI, CC BY 4.0) as shipped with
scikit-learn: 569 examples, 30 features standardized to zero mean and unit
variance, label +1 for malignant and -1 for benign. Run once; the output is
committed so a fresh install trains without any download.
"""

import os

import numpy as np
from sklearn.datasets import load_breast_cancer


def main():
    X, target = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    y = np.where(target == 0, 1.0, -1.0)  # scikit-learn codes malignant as 0
    out = os.path.join(os.path.dirname(__file__), "..", "prbmrm", "_data", "breast_cancer.npz")
    np.savez_compressed(out, X=X.astype(np.float64), y=y)
    print(f"wrote {os.path.normpath(out)}: {X.shape[0]} x {X.shape[1]}, {int((y > 0).sum())} malignant")


if __name__ == "__main__":
    main()
