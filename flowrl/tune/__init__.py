"""flowrl on Ray Tune: hyperparameter search and population-based training.

:func:`run` runs an experiment (a tuned example with search spaces, a scheduler, a search
algorithm; see :mod:`flowrl.tune.spec`) whose trials are flowrl trainers
(:func:`trainable_for`), or continues an interrupted one; ``flowrl tune`` is its command.
"""

from flowrl.tune.experiment import TrialSummary, TuneSummary, run, write_trials_csv
from flowrl.tune.spec import TuneSpec, load_spec, parse_spec
from flowrl.tune.trainable import live_keys, trainable_for

__all__ = [
    "TrialSummary",
    "TuneSpec",
    "TuneSummary",
    "live_keys",
    "load_spec",
    "parse_spec",
    "run",
    "trainable_for",
    "write_trials_csv",
]
