"""The RL dataflow vocabulary (rollouts, replay, training, metrics) built on ``flowrl.iterators``."""
