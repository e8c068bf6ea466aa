"""The multi-turn side of a GRPO/PPO run, built from rollout.agent on trainer rank 0: the episode group sampler
(its workflow, tools, code tool, parser and limits) and the sampled-token budget its overlong penalty ends at."""

from __future__ import annotations

from typing import Any

from rlkit.config.allocation import parse_allocation
from rlkit.config.schema.experiment import ExperimentConfig, agent_limits


def sampled_budget(config: ExperimentConfig) -> int:
    """The most tokens a sample's servers may sample (the overlong penalty's end): gconfig.max_new_tokens, or for
    an episode max_turns turns of max_tokens_per_turn."""
    if not config.rollout.agent.workflow:
        return config.gconfig.max_new_tokens
    turns, _, per_turn = agent_limits(config, None)
    return turns * per_turn


# where credentials of the job's user usually are (README "The code tool"): SSH and GPG keys; W&B's API key
# (.netrc), its settings and most tools' (.config); Hugging Face's token (old and new place) and cache; Kaggle, AWS,
# Azure, Google Cloud, Docker, Kubernetes, PyPI and git credentials; shell and REPL histories (keys typed in)
HOME_SECRETS = (".ssh", ".gnupg", ".netrc", ".config", ".cache/huggingface", ".huggingface", ".kaggle", ".aws",
                ".azure", ".docker", ".kube", ".pypirc", ".git-credentials", ".bash_history", ".zsh_history",
                ".sh_history", ".history", ".python_history", ".local/share/fish", ".psql_history",
                ".mysql_history", ".sqlite_history", ".lesshst", ".viminfo")


def hidden_from_code(config: ExperimentConfig) -> list[str]:
    """What the code tool's runs must not see: the trials (tokens, checkpoints), rlkit's home, the training and
    validation data (answers a policy could learn to read: relative paths and link targets resolved, a Hugging
    Face cache's whole repository), and the usual places of the user's credentials."""
    from pathlib import Path

    from rlkit.agent.sandbox_paths import dataset_paths
    from rlkit.trials.records import rlkit_home

    home = Path.home()
    paths = [config.cluster.fileroot, str(rlkit_home()), *(str(home / name) for name in HOME_SECRETS)]
    for dataset in (config.train_dataset.path, config.valid_dataset.path):
        paths.extend(dataset_paths(dataset))
    return paths


def code_tool_for(settings: Any, hide: list[str] | tuple[str, ...] = ()) -> Any:
    """rollout.agent.code_tool as the registry's `python` tool (its own time limit plus the sandbox's start-up)."""
    import atexit
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from rlkit.agent.code_tool import CodeTool, limits_of
    from rlkit.agent.python_tool import PYTHON_TOOL_SCHEMA, isolation_summary, python_tool
    from rlkit.agent.tools import make_tool

    limits = limits_of(settings)
    # A directory of our own, made atomically (mkdtemp: mode 0700, never an existing path or a symlink someone
    # planted); only it is opened to traversal, for the sandbox's user (nobody, when the trainer runs as root).
    # scratch_root itself (e.g. /tmp, shared with other users) is never created, chmod-ed or chown-ed here.
    root = Path(tempfile.mkdtemp(prefix=f"rlkit-code-tool-{os.getuid()}-", dir=settings.scratch_root))
    root.chmod(0o711)
    atexit.register(shutil.rmtree, root, True)
    tool = CodeTool(limits, root, python=settings.python or None, hide=hide, isolation=settings.isolation)
    print(f"rlkit code tool: {isolation_summary(tool)}", flush=True)
    return make_tool(python_tool(tool), PYTHON_TOOL_SCHEMA, timeout_s=settings.wall_seconds + 30.0)


def episode_groups(config: ExperimentConfig, tokenizer: Any, reward: Any) -> Any:
    """The multi-turn group sampler of rollout.agent (rlkit.rollout.groups.EpisodeGroups), None without a workflow."""
    agent = config.rollout.agent
    if not agent.workflow:
        return None
    alloc = parse_allocation(config.allocation_mode)
    from rlkit.agent.context import EpisodeServices
    from rlkit.agent.tool_calls import resolve_tool_call_parser
    from rlkit.agent.tools import ToolConfig, ToolRegistry, load_tools
    from rlkit.agent.trajectory import TrajectoryLimits
    from rlkit.agent.workflows import resolve_workflow
    from rlkit.config.model_config import vocab_size
    from rlkit.rollout.groups import EpisodeGroups
    from rlkit.servers.backend import servers_context
    from rlkit.servers.sampling import sampling_params

    loaded = load_tools([ToolConfig(fn, timeout_s=agent.tool_timeout) for fn in agent.tools],
                        setting="rollout.agent.tools")
    if agent.code_tool.enabled:
        loaded.append(code_tool_for(agent.code_tool, hidden_from_code(config)))
    tools = ToolRegistry(loaded, max_result_chars=agent.max_tool_result_chars)
    services = EpisodeServices(score=reward.score, tokenizer=tokenizer, tools=tools,
                               parser=resolve_tool_call_parser(agent.tool_call_parser), params=sampling_params(config),
                               limits=TrajectoryLimits(*agent_limits(config, servers_context(config, alloc))),
                               vocab_size=vocab_size(config.actor.path))
    workflow = resolve_workflow(agent.workflow, agent=agent)
    return EpisodeGroups(workflow, services, n_samples=config.gconfig.n_samples,
                         seed=config.seed, tool_schemas=tools.schemas(),
                         prompt_key=config.train_dataset.prompt_key)
