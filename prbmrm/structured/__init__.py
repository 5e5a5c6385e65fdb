"""Structured estimation: a joint feature map and a loss-augmented argmax make a loss (paper 000 Sec. A.2).

A plug-in of the core, like a third-party one: importing it registers its models as losses
(:func:`prbmrm.losses.register_loss`) and its ragged shard layout (:func:`prbmrm.io.register_layout`);
:func:`prbmrm.plugins.load_builtin_plugins` imports it the first time a registry misses a name.
Imports: numpy, scipy, :mod:`prbmrm.losses`, :mod:`prbmrm.io`, :mod:`prbmrm.io.files`,
:mod:`prbmrm.errors` and :mod:`prbmrm.params`. Outside this package only the layers above the
core import it: :mod:`prbmrm.training` (structured examples in memory) and :mod:`prbmrm.cli.shard`.
"""

from .base import RaggedExamples, StructuredLoss, StructuredModel
from .chain import ChainModel, viterbi
from .matching import MatchingModel, pair_features
from .synthetic import make_chain_data, make_matching_data
from . import data  # noqa: F401  (importing it registers the ragged shard layout)
from ..losses import register_loss

# The built-in models are losses by name (``--loss chain --loss-param n_states=5``).
for _model in (ChainModel, MatchingModel):
    register_loss(_model)

__all__ = ["ChainModel", "MatchingModel", "RaggedExamples", "StructuredLoss", "StructuredModel",
           "make_chain_data", "make_matching_data", "pair_features", "viterbi"]
