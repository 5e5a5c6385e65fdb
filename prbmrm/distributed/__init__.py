"""The distributed layer: communicators, the watch for silent ranks, typed messages, the risk oracle.

:mod:`~prbmrm.distributed.comm` is the only module of prbmrm that imports mpi4py; every other
module is serial code handed a communicator.
"""
