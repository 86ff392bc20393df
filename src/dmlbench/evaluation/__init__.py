"""Evaluation of test-set embeddings: Recall@K, NMI, MAP@R and R-precision.

Exact kNN search with faiss in query chunks (no dense N × N matrix), K-means
NMI with recorded settings, per-learner metrics for ensembles, per-query results
(:mod:`.per_query`) for the report's confidence intervals, and an ``.npz`` → JSON entry
point for the workflow.
"""

from dmlbench.evaluation.clustering import KMeansSettings
from dmlbench.evaluation.evaluate import Evaluation, evaluate_embeddings, evaluate_views, recall_at_k
from dmlbench.evaluation.files import evaluate_file

__all__ = ["Evaluation", "KMeansSettings", "evaluate_embeddings", "evaluate_file", "evaluate_views", "recall_at_k"]
