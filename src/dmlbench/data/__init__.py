"""Datasets: preparers (one module per dataset), the manifest, transforms and samplers."""
