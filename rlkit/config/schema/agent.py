"""The `rollout.agent` section (AReaL's name): multi-turn, tool-using episodes instead of one completion per sample.

An empty `workflow` keeps the single-turn rollout (one request for a GRPO group, `gconfig` as it is). With a
workflow, each sample of a group is one episode of `async def episode(ctx, row) -> Episode` (rlkit.agent.context:
the turns are sampled by the live servers, tool results and other inserted text are tokenized once by rlkit and
masked out of the loss). `tool_call_parser` keeps AReaL's name and its default `qwen` (the Qwen2.5 / Hermes
`<tool_call>` JSON format). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkit.config.schema.fields import _f, _sub

TOOL_USE_WORKFLOW = "tool_use"  # the built-in multi-turn loop: generate, call the tools asked for, repeat
OPENAI_WORKFLOW = "openai"  # the user's agent program against rlkit's OpenAI-compatible endpoint (rollout.agent.openai)
VERIFIERS_WORKFLOW = "verifiers"  # a verifiers environment's episodes through the token-level route (.verifiers)
BUILTIN_WORKFLOWS = (TOOL_USE_WORKFLOW, OPENAI_WORKFLOW, VERIFIERS_WORKFLOW)
OFFLINE_HARNESSES = ("null",)  # verifiers harnesses checked to run with no network (its plain chat program)
OFFLINE_RUNTIMES = ("subprocess",)  # the others are remote sandboxes (prime, modal, e2b) or container images


@dataclass
class OpenAIAgentConfig:
    """The agent program of `workflow: openai` (rlkit.agent.openai_workflow): exactly one of agent and command."""

    agent: str = _f("", "module.path:function or /abs/path/file.py:function, called once per episode as "
                        "agent(base_url, row) (sync in a thread, or async) with the episode's OpenAI base URL; returns "
                        "the episode's reward, or None to score the last reply with reward.fn.")
    command: list[str] = _f([], "A command line run once per episode instead, with OPENAI_BASE_URL and OPENAI_API_KEY "
                                "set to the episode's and the row as JSON on stdin; its last line of output is the "
                                "reward (a number, or null for reward.fn); a non-zero exit drops the episode.")
    timeout: float = _f(300.0, "Seconds one episode's program may run; past it the episode is dropped (its key "
                               "revoked, a command's process group killed).", gt=0)


@dataclass
class VerifiersAgentConfig:
    """The environment of `workflow: verifiers` (rlkit.agent.verifiers_workflow), run by verifiers in its own venv."""

    environment: str = _f("", "The verifiers taskset id: a module importable in the verifiers venv that exports its "
                              "Taskset (what verifiers' --env.taskset.id names); one agent plays it.")
    args: dict[str, Any] = _f({}, "The taskset's config fields (verifiers' --env.taskset.*), passed as given.")
    harness: str = _f("null", "The verifiers harness that plays a task: null (its plain chat program; verifiers' name, "
                              "so quote it in YAML, \"null\", or leave the key out) is the one that runs with no "
                              "network; the others install agent CLIs or run code and are refused.")
    runtime: str = _f("subprocess", "Where the harness runs: subprocess (on the trainer's node). prime, modal and e2b "
                                    "are remote sandboxes reached through a Prime tunnel (network and a Prime login); "
                                    "docker and apptainer pull images: refused.")
    python: str = _f("", "The verifiers venv's interpreter; empty: $RLKIT_VERIFIERS_PYTHON, else "
                         "~/.cache/rlkit-verifiers/venv/bin/python (scripts/verifiers-env.sh installs it).")
    timeout: float = _f(300.0, "Seconds one episode may run; past it the episode is dropped.", gt=0)


@dataclass
class CodeToolConfig:
    """The built-in `python` tool: model-written code in a killable sandbox (rlkit.agent.code_tool)."""

    enabled: bool = _f(False, "Offer the `python` tool (argument: code) to the model.")
    wall_seconds: float = _f(10.0, "Wall-clock seconds one run may take, interpreter start included.")
    cpu_seconds: int = _f(10, "CPU seconds one run may use.")
    memory_mb: int = _f(512, "Heap of the code's process, in MB.")
    output_bytes: int = _f(8192, "Output kept (stdout and stderr); more stops the run.")
    file_mb: int = _f(64, "Largest file the code may write in its scratch directory, in MB.")
    scratch_mb: int = _f(256, "All the files of one run together, in MB (its scratch directory is an in-memory "
                              "tmpfs of this size where the node gives namespaces).")
    max_concurrent: int = _f(8, "Runs at once on the trainer's rank-0 node.")
    python: str = _f("", "Interpreter of the runs; empty: the trainer's (or /usr/bin/python3 when the sandbox user "
                         "cannot reach it).")
    scratch_root: str = _f("/tmp", "Node-local directory where the trainer makes its own private directory for the "
                                   "runs' scratch directories (every user must be able to traverse it, like /tmp).")
    isolation: str = _f("required", "required: a run is refused (a tool error; the code never starts) when its "
                                    "namespaces, private /proc, read-only mounts or hidden paths cannot be set up on "
                                    "the node; best_effort: it runs with what holds (the trainer log says what not).")


@dataclass
class AgentConfig:
    """Multi-turn episodes: the workflow, its tools, and how long an episode may grow."""

    workflow: str = _f("", "Episode workflow: tool_use (built in: sample a turn, run the tool calls it makes, repeat "
                           "until a turn calls none), openai (your agent program, unmodified, against rlkit's "
                           "OpenAI-compatible endpoint: rollout.agent.openai), verifiers (a verifiers environment: "
                           "rollout.agent.verifiers) or module.path:function / "
                           "file.py:function, an async def episode(ctx, row) -> Episode; empty: single-turn rollouts.")
    tool_call_parser: str = _f("qwen", "How tool calls are read from a turn: qwen (Qwen2.5 / Hermes <tool_call> JSON, "
                                       "also called hermes) or module.path:function(text) -> ParsedTurn.")
    tools: list[str] = _f([], "Tools offered to the model, each module.path:function (sync or async, keyword "
                              "arguments) with its JSON schema in the function's tool_schema attribute.")
    tool_timeout: float = _f(30.0, "Seconds one tool call may take before the model is told it timed out.", gt=0)
    max_turns: int = _f(4, "Most assistant turns in an episode; an episode that wants more is truncated.", ge=1)
    max_tokens_per_turn: int | None = _f(None, "Most tokens one turn may sample; None: gconfig.max_new_tokens.", ge=1)
    engine_max_tokens: int | None = _f(None, "Most tokens of an episode, prompt included (AReaL's name); None: the "
                                             "servers' context length.", ge=1)
    max_tool_result_chars: int = _f(4000, "A tool result longer than this is cut (the model is told).", ge=1)
    code_tool: CodeToolConfig = _sub(CodeToolConfig, "The built-in sandboxed Python tool.")
    openai: OpenAIAgentConfig = _sub(OpenAIAgentConfig, "The agent program of workflow openai.")
    verifiers: VerifiersAgentConfig = _sub(VerifiersAgentConfig, "The verifiers environment of workflow verifiers.")


DEFAULT_MAX_TOTAL_TOKENS = 32768  # an episode's token limit when neither the config nor the model says one
