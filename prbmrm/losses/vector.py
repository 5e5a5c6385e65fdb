"""Vector losses of the scores f = W^T x, one per class (paper 000, Table 6 and App. A.4)."""

VECTOR_LOSSES = ()
