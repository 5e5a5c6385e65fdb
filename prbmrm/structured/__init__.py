"""Structured estimation: a joint feature map and a loss-augmented argmax make a loss (paper 000 Sec. A.2)."""

from ._base import RaggedExamples, StructuredLoss, StructuredModel
from .chain import ChainModel, viterbi
from .matching import MatchingModel, pair_features
from .synthetic import make_chain_data, make_matching_data

__all__ = ["ChainModel", "MatchingModel", "RaggedExamples", "StructuredLoss", "StructuredModel",
           "make_chain_data", "make_matching_data", "pair_features", "viterbi"]
