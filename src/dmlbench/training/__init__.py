"""Training: the generic trainer, checkpoints, seeding, and embedding extraction."""
