"""dmlbench: a reproducible benchmark of deep metric learning, run as a DAG."""

__version__ = "0.1.0"
