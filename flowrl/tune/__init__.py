"""flowrl on Ray Tune: hyperparameter search and population-based training."""
