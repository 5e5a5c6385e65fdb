"""prbmrm: distributed bundle methods for regularized risk minimization.

Trains regularized linear models with BMRM (Teo, Vishwanathan, Smola and Le,
JMLR 2010) on data split into HDF5 shards, one or more per MPI rank: rank 0
holds the bundle and solves the subproblem, every rank computes the risk and
subgradient of its own shard, and one Allreduce combines them per iteration.
"""

__version__ = "0.1.0"
