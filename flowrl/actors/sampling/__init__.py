"""Samplers: the vectorized sampler of a rollout worker, its fault recovery and observation checks, the
multi-agent sampler and the episode hooks they run."""
