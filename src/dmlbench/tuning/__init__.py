"""Equal-budget tuning (the protocol of Musgrave et al., "A Metric Learning Reality Check", 2020).

Every trained method of a table listed under ``tuning.tables`` gets the same budget of trials; a trial
trains ``k`` times, each on ``k - 1`` class-disjoint folds of the training classes, and is scored on the
held-out fold, never on the test split. ``<table>_tuned`` then retrains each method with its best settings.

- :mod:`.space`: a method's search space (``methods.<m>.tuning.space``);
- :mod:`.entries`: the generated ``<m>_tuned`` entries and ``<table>_tuned`` tables, and best.yaml overlays;
- :mod:`.folds`: the class-disjoint folds and a trial's data (training classes only);
- :mod:`.study`: the Optuna study (TPE, seeded, in a journal file that a killed job resumes) and its outputs.

docs/tuning.md states the protocol and its cost.
"""
