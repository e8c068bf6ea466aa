"""How a step's command runs: inside its role's Apptainer image, or bare on the host (pure)."""

from __future__ import annotations


def container_argv(argv: tuple[str, ...], *, container_type: str, image: str, apptainer_args: tuple[str, ...],
                   binds: tuple[str, ...]) -> tuple[str, ...]:
    """The command line that runs `argv` for one step.

    Apptainer passes the host environment into the container (we never use --cleanenv), so variables that Slurm and
    the batch script set reach the step; the trial directory and name-resolve root are among the binds. `--pwd /`
    starts the step in the image's root, never in a directory of the host another user could plant modules in.
    """
    if container_type == "none":
        return argv
    bind = ("--bind", ",".join(binds)) if binds else ()
    return ("apptainer", "exec", "--pwd", "/", *apptainer_args, *bind, image, *argv)


def container_lacks_gpu_driver(container_type: str, apptainer_args: tuple[str, ...]) -> bool:
    """Whether the steps run in a container that has no NVIDIA driver: apptainer binds the host's driver and
    nvidia-smi into the image only with --nv (or --nvccli, nvidia-container-cli's way of doing it)."""
    return container_type != "none" and not {"--nv", "--nvccli"} & set(apptainer_args)
