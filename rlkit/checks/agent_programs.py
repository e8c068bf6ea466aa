"""Submit-time checks of the programs an agent workflow starts on the trainer's node: the verifiers venv's interpreter
(rollout.agent.verifiers.python, else $RLKIT_VERIFIERS_PYTHON, else the default venv in the submitting user's home)
and an agent command given by absolute path (rollout.agent.openai.command[0]). Without them each episode's start
fails in the job, after the queue wait (a FatalStepError there).

Checked where the login node sees such a path as the nodes do: one that exists here must be an executable file, and
one under the home directory or cluster.fileroot (the shared filesystem) must exist. Both are site problems, as a
missing model or sglang.python is: `rlkit submit` refuses them, `rlkit render` lists them as warnings. A path
elsewhere that is not here may be node-local (a venv on each node's local disk, or inside the image) and is left to
the job; a bare name is looked up in the node's PATH.
"""

from __future__ import annotations

import os

from rlkit.checks.binds import is_under
from rlkit.config.problems import Problems
from rlkit.config.schema.agent import OPENAI_WORKFLOW, VERIFIERS_WORKFLOW
from rlkit.config.schema.experiment import ExperimentConfig

_VENV_FIX = "build the venv with `bash scripts/verifiers-env.sh` (it prints its python), or set {field} to its python"


def validate_agent_programs(config: ExperimentConfig, problems: Problems) -> None:
    """Add a problem for each program of the configured workflow that cannot run, as seen from here."""
    agent = config.rollout.agent
    workflow = agent.workflow.strip()
    if workflow == VERIFIERS_WORKFLOW:
        from rlkit.agent.verifiers_workflow import verifiers_python

        setting = agent.verifiers.python.strip()
        field = ("rollout.agent.verifiers.python" if setting else
                 "$RLKIT_VERIFIERS_PYTHON" if os.environ.get("RLKIT_VERIFIERS_PYTHON") else
                 "the verifiers venv's python (rollout.agent.verifiers.python empty)")
        _check_program(config, field, verifiers_python(setting), problems,
                       _VENV_FIX.format(field="rollout.agent.verifiers.python"))
    elif workflow == OPENAI_WORKFLOW and agent.openai.command:
        program = agent.openai.command[0]
        if isinstance(program, str):
            _check_program(config, "rollout.agent.openai.command[0]", program, problems,
                           "give the agent program's path on the shared filesystem, executable (chmod +x), or run it "
                           "with its interpreter: command=[python3, /path/agent.py]")


def _check_program(config: ExperimentConfig, field: str, path: str, problems: Problems, fix: str) -> None:
    if not path.startswith("/"):
        return  # a name looked up in the node's PATH
    try:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return
        exists = os.path.exists(path)
    except (OSError, ValueError):  # ValueError: a NUL byte
        exists = False
    shared = [root for root in (os.path.expanduser("~"), config.cluster.fileroot) if root.startswith("/")]
    if exists:
        problems.add(f"{field}: '{path}' is not an executable file", hint=fix, site=True)
    elif any(is_under(os.path.normpath(path), os.path.normpath(root)) for root in shared if root != "/"):
        problems.add(f"{field}: '{path}' does not exist (the shared filesystem, seen from here as from the nodes)",
                     hint=fix, site=True)
