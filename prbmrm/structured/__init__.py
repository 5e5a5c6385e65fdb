"""Structured estimation: a joint feature map and a loss-augmented argmax make a loss (paper 000 Sec. A.2)."""

from ._base import RaggedExamples, StructuredLoss, StructuredModel
from .chain import ChainModel, viterbi
from .matching import MatchingModel, pair_features
from .synthetic import make_chain_data, make_matching_data
from ..losses import LOSSES

# The built-in models are losses by name (``--loss chain --loss-param n_states=5``).
LOSSES.update({model.name: model for model in (ChainModel, MatchingModel)})

__all__ = ["ChainModel", "MatchingModel", "RaggedExamples", "StructuredLoss", "StructuredModel",
           "make_chain_data", "make_matching_data", "pair_features", "viterbi"]
