"""Submit-time checks of rollout.agent (multi-turn episodes): every problem collected with its fix. The workflow, tools
and tool-call parser are imported here, on the login node, as reward.fn is, so a typo fails at submit and not after
the job waited in the queue. Torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlkit.checks.agent_programs import validate_agent_programs
from rlkit.config.problems import Problems, refuse_inert_fields
from rlkit.config.schema.agent import (
    OFFLINE_HARNESSES,
    OFFLINE_RUNTIMES,
    OPENAI_WORKFLOW,
    VERIFIERS_WORKFLOW,
    AgentConfig,
)
from rlkit.config.schema.evaluation import evaluation_enabled
from rlkit.config.schema.experiment import ExperimentConfig, agent_limits

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType
    from rlkit.jobs.job_types import JobTypes

def agent_in_use(agent: AgentConfig) -> bool:
    return bool(agent.workflow.strip())


def validate_agent(config: ExperimentConfig, job: JobType, job_types: JobTypes, problems: Problems,
                   context: int | None) -> None:
    """Add every problem of rollout.agent to `problems`; `job`: config's job type (episodes replace the samples of a
    trainer on rollouts); `context`: the servers' context length when known."""
    from rlkit.agent.tool_calls import resolve_tool_call_parser
    from rlkit.agent.tools import ToolConfig, load_tools
    from rlkit.agent.workflows import resolve_workflow

    agent = config.rollout.agent
    _validate_openai_fields(agent, problems)
    _validate_verifiers_fields(agent, problems)
    if agent.workflow.strip() == VERIFIERS_WORKFLOW:
        _validate_verifiers_rows(config, problems)
    validate_agent_programs(config, problems)  # the verifiers venv's python, an agent command's program
    if not agent_in_use(agent):
        if agent.tools:
            problems.add("rollout.agent.tools is set but rollout.agent.workflow is empty: single-turn rollouts call no "
                         "tools", hint="set rollout.agent.workflow=tool_use (or your own), or remove the tools")
        if agent.code_tool.enabled:
            problems.add("rollout.agent.code_tool.enabled is set but rollout.agent.workflow is empty: single-turn "
                         "rollouts run no code", hint="set rollout.agent.workflow=tool_use, or remove the code tool")
        return
    if not job.trains_on_rollouts:
        users = " or ".join(j.name for j in job_types if j.trains_on_rollouts)
        problems.add(f"rollout.agent.workflow is set, but job type {job.name} runs no training rollouts",
                     hint=f"use it with type {users}, or remove rollout.agent")
        return
    with problems.check():
        resolve_workflow(agent.workflow, agent=agent)
    with problems.check():
        resolve_tool_call_parser(agent.tool_call_parser)
    names: list[str] = []
    schemas: list[dict[str, Any]] | None = None
    with problems.check():
        tools = load_tools([ToolConfig(fn, timeout_s=agent.tool_timeout) for fn in agent.tools],
                           setting="rollout.agent.tools")
        names, schemas = [tool.name for tool in tools], [tool.schema() for tool in tools]
    if agent.code_tool.enabled and "python" in names:
        problems.add("rollout.agent.tools has a tool named `python` (its schema's name), and "
                     "rollout.agent.code_tool.enabled adds the built-in python tool",
                     hint="name your tool otherwise in its tool_schema, or disable the code tool")
    total = agent.engine_max_tokens
    if total is not None and context is not None and total > context:
        problems.add(f"rollout.agent.engine_max_tokens ({total}) exceeds the servers' context of {context} tokens: "
                     "a late turn would be refused", hint=f"set it to at most {context}")
    _validate_code_tool(config, problems)
    per_turn = agent.max_tokens_per_turn
    if per_turn is not None and per_turn > config.gconfig.max_new_tokens:
        problems.add(f"rollout.agent.max_tokens_per_turn ({per_turn}) exceeds gconfig.max_new_tokens "
                     f"({config.gconfig.max_new_tokens})", hint="lower it, or raise gconfig.max_new_tokens")
    _validate_eval_turns(config, problems)
    if schemas is not None:
        from rlkit.agent.python_tool import PYTHON_TOOL_SCHEMA
        from rlkit.checks.agent_room import validate_turn_room

        validate_turn_room(config, schemas + ([PYTHON_TOOL_SCHEMA] if agent.code_tool.enabled else []), problems,
                           context)


def _validate_openai_fields(agent: AgentConfig, problems: Problems) -> None:
    """rollout.agent.openai only with workflow openai; with it, the agent program brings its own tools."""
    if agent.workflow.strip() != OPENAI_WORKFLOW:
        refuse_inert_fields(problems, agent.openai, "rollout.agent.openai",
                            because=f"rollout.agent.workflow is not {OPENAI_WORKFLOW}",
                            hint=f"set rollout.agent.workflow={OPENAI_WORKFLOW}, or remove rollout.agent.openai")
        return
    if agent.tools:
        problems.add("rollout.agent.tools is set, but with workflow openai the agent program offers its tools in its "
                     "calls and runs them itself: rlkit would never call these",
                     hint="remove rollout.agent.tools (give the tools to your agent program)")
    if agent.code_tool.enabled:
        problems.add("rollout.agent.code_tool.enabled is set, but with workflow openai the agent program runs its own "
                     "tools: rlkit's python tool would never be offered", hint="remove rollout.agent.code_tool")


def _validate_verifiers_fields(agent: AgentConfig, problems: Problems) -> None:
    """rollout.agent.verifiers only with workflow verifiers; with it, only the parts of verifiers that run with no
    network (checked with verifiers 0.4.0: docs/guides/verifiers.md), and no rlkit tools (the environment has its)."""
    settings = agent.verifiers
    if agent.workflow.strip() != VERIFIERS_WORKFLOW:
        refuse_inert_fields(problems, settings, "rollout.agent.verifiers",
                            because=f"rollout.agent.workflow is not {VERIFIERS_WORKFLOW}",
                            hint=f"set rollout.agent.workflow={VERIFIERS_WORKFLOW}, or remove rollout.agent.verifiers")
        return
    if settings.harness not in OFFLINE_HARNESSES:
        problems.add(f"rollout.agent.verifiers.harness={settings.harness!r}: verifiers' other harnesses install agent "
                     "CLIs or run model-written code, bootstrapped from the network (uv, npm), which compute nodes "
                     "often cannot reach; rlkit runs only the ones checked to run offline",
                     hint=f"use harness {' or '.join(OFFLINE_HARNESSES)} (its plain chat program)")
    if settings.runtime not in OFFLINE_RUNTIMES:
        problems.add(f"rollout.agent.verifiers.runtime={settings.runtime!r}: prime, modal and e2b are remote sandboxes "
                     "that reach the trainer through a Prime tunnel (network and a Prime login), docker and "
                     "apptainer pull the task's image: none runs on an offline compute node",
                     hint=f"use runtime {' or '.join(OFFLINE_RUNTIMES)} (the harness runs on the trainer's node)")
    for setting, used in (("rollout.agent.tools", bool(agent.tools)),
                          ("rollout.agent.code_tool.enabled", agent.code_tool.enabled)):
        if used:
            problems.add(f"{setting} is set, but with workflow verifiers the environment brings its own tools: rlkit "
                         "would never offer these", hint=f"remove {setting}")


def _validate_verifiers_rows(config: ExperimentConfig, problems: Problems) -> None:
    """Every one of the first training rows names its task by index (`task`), or no episode of it could start
    (JSON Lines, and Parquet where pyarrow is installed here: without it a Parquet file's rows are checked in the
    job)."""
    from pathlib import Path

    from rlkit.agent.verifiers_workflow import TASK_FIELD
    from rlkit.data.dataset_head import dataset_head
    from rlkit.errors import ConfigError

    datasets = [("train_dataset.path", config.train_dataset.path)]
    if evaluation_enabled(config.evaluator) and config.valid_dataset.path:  # the evaluator plays episodes too
        datasets.append(("valid_dataset.path", config.valid_dataset.path))
    for setting, path in datasets:
        try:
            head = dataset_head(setting, Path(path))
            rows = head.rows(64, [TASK_FIELD]) if head else []
        except ConfigError:
            continue  # the dataset checks say what is wrong with the file
        bad = [number for number, row in enumerate(rows, 1)
               if not isinstance(row, dict) or isinstance(row.get(TASK_FIELD), bool)
               or not isinstance(row.get(TASK_FIELD), int) or row[TASK_FIELD] < 0]
        if bad:
            problems.add(f"{setting} {path}: rows {', '.join(map(str, bad[:5]))}{' ...' if len(bad) > 5 else ''} "
                         f"have no '{TASK_FIELD}': with workflow verifiers each row names the task it plays by its "
                         "index in the taskset", hint=f'write rows such as {{"prompt": "...", "{TASK_FIELD}": 0}} '
                                                      "(the prompt the model sees is the one verifiers renders)")


def _validate_eval_turns(config: ExperimentConfig, problems: Problems) -> None:
    """The evaluator runs the training episodes (same workflow, tools and limits, rlkit.trainer.evaluator): a turn of
    an evaluation episode may sample fewer tokens (eval_gconfig.max_new_tokens), never more than a training turn."""
    wanted = config.eval_gconfig.max_new_tokens
    if not evaluation_enabled(config.evaluator) or wanted is None or isinstance(wanted, bool):
        return
    _, _, per_turn = agent_limits(config, None)
    setting = ("rollout.agent.max_tokens_per_turn" if config.rollout.agent.max_tokens_per_turn
               else "gconfig.max_new_tokens")
    if isinstance(per_turn, int) and wanted > per_turn:
        problems.add(f"eval_gconfig.max_new_tokens ({wanted}) exceeds an episode turn's limit of {per_turn} tokens "
                     f"({setting}): evaluation episodes keep the training episodes' limits, so it would be ignored",
                     hint=f"set eval_gconfig.max_new_tokens to at most {per_turn}, or null")


def _validate_code_tool(config: ExperimentConfig, problems: Problems) -> None:
    from rlkit.agent.code_tool import ISOLATION_LEVELS, code_limit_problems, limits_of

    settings = config.rollout.agent.code_tool
    if not settings.enabled:
        refuse_inert_fields(problems, settings, "rollout.agent.code_tool",
                            because="rollout.agent.code_tool.enabled is false",
                            hint="set rollout.agent.code_tool.enabled=true, or remove {field}")
        return
    for name, message, fix in code_limit_problems(limits_of(settings)):
        problems.add(f"rollout.agent.code_tool.{name} {message}", hint=fix)
    if settings.isolation not in ISOLATION_LEVELS:
        problems.add(f"rollout.agent.code_tool.isolation {settings.isolation!r} is not one of "
                     f"{', '.join(ISOLATION_LEVELS)}", hint="set it to required (the default: refuse runs the node "
                     "cannot isolate) or best_effort")
    if not settings.scratch_root.startswith("/"):
        problems.add(f"rollout.agent.code_tool.scratch_root '{settings.scratch_root}' must be an absolute path",
                     hint="e.g. /tmp/rlkit-code-tool (node-local is fine)")
