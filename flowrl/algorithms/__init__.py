"""One module per algorithm: typed config, loss and execution plan, registered by name."""

from flowrl.algorithms.registry import (
    Algorithm,
    algorithm_descriptions,
    get_algorithm,
    list_algorithms,
    register_algorithm,
)
from flowrl.errors import UnknownAlgorithmError

__all__ = [
    "Algorithm",
    "UnknownAlgorithmError",
    "algorithm_descriptions",
    "get_algorithm",
    "list_algorithms",
    "register_algorithm",
]
