"""At submit: an image built by `rlkit image build` carries its role and versions as labels; one built for another
role (a vllm image where the config runs SGLang, a server image as the trainer's) or from another rlkit or pins is
named before the job waits in the queue, instead of failing in its first step on the nodes."""

from __future__ import annotations

import rlkit
from rlkit.config.allocation import Allocation
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.images.labels import rlkit_labels
from rlkit.images.pins import label_problems, load_pins


def check_image_labels(config: ExperimentConfig, allocation: Allocation, problems: Problems) -> None:
    """Each role's image, when it carries rlkit labels, is of that role and this rlkit's pinned versions."""
    slurm = config.launcher.slurm
    wanted = {"trainer_image": "trainer" if allocation.trainer is not None else None,
              "inference_server_image": allocation.server.backend if allocation.server is not None else None}
    for field, role in wanted.items():
        image = getattr(slurm, field)
        labels = rlkit_labels(image) if role is not None else None
        if labels is None:
            continue
        for problem in label_problems(labels, load_pins(), rlkit.__version__, role):
            problems.add(f"launcher.slurm.{field} {image}: {problem}", site=True)
