"""Evaluation of test-set embeddings: Recall@K, NMI, MAP@R and R-precision.

Exact kNN search with faiss in query chunks (no dense N × N matrix), K-means
NMI with recorded settings, per-learner metrics for ensembles, and an
``.npz`` → JSON entry point for the workflow.
"""

from dmlbench.evaluation.clustering import KMeansSettings
from dmlbench.evaluation.evaluate import evaluate_embeddings, recall_at_k
from dmlbench.evaluation.files import evaluate_file

__all__ = ["KMeansSettings", "evaluate_embeddings", "evaluate_file", "recall_at_k"]
