"""Stateful Ray actors: rollout workers, worker sets, replay shards and learner threads."""
