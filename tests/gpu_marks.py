"""What the gpu tests share: their marks and the device ``num_gpus: 1`` gives them.

Without CUDA they skip; ``FLOWRL_GPU_REHEARSAL=1`` runs them anyway, ``num_gpus`` then giving the CPU, which
rehearses every check's logic on a machine without a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

REHEARSAL = os.environ.get("FLOWRL_GPU_REHEARSAL") == "1"
#: What ``num_gpus: 1`` gives a learner policy: CUDA where there is a device, the CPU in a rehearsal.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: Every gpu test's marks besides its tier. A skip mark, not a module-level skip: the other tiers' runs
#: deselect these tests instead of counting a skip each. A rehearsal asks for a GPU that is not there, and
#: is told so (the warning filtered).
GPU_MARKS = [
    pytest.mark.skipif(
        not torch.cuda.is_available() and not REHEARSAL,
        reason="needs a CUDA device (runs on a lent GPU machine); FLOWRL_GPU_REHEARSAL=1 rehearses it on the CPU",
    ),
    pytest.mark.gpu,
    pytest.mark.filterwarnings("ignore:num_gpus=.*CUDA is not available"),
]
