"""The run lifecycle: training to a stop criterion with checkpoints, resuming, signals and experiment
files."""
