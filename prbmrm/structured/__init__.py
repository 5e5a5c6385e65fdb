"""Structured estimation: a joint feature map and a loss-augmented argmax make a loss (paper 000 Sec. A.2)."""

from ._base import RaggedExamples, StructuredLoss, StructuredModel

__all__ = ["RaggedExamples", "StructuredLoss", "StructuredModel"]
