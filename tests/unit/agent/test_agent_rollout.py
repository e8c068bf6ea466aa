"""Episodes as the rollout runs them (rlkit.agent.context, rlkit.agent.workflows, rlkit.rollout.groups) with the tiny
tokenizer: what a turn may change, how tool calls become masked messages, what a group of episodes hands the
trainer, and the submit-time checks of rollout.agent. The server is a scripted `complete` function that returns the
ids a test chooses (the pool and real servers are the end-to-end test's: tests/integration/test_agent_e2e.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rlkit.agent.context import EpisodeContext, EpisodeServices
from rlkit.agent.tool_calls import parse_hermes
from rlkit.agent.tools import ToolRegistry, make_tool
from rlkit.agent.trajectory import INSERTED_VERSION, TrajectoryLimits
from rlkit.agent.workflows import resolve_workflow, tool_use
from rlkit.config.load import load_config
from rlkit.errors import NO_RETRY_EXIT, ConfigError, StepError
from rlkit.jobs.validate import validate
from rlkit.rewards.runner import RewardOutcome
from rlkit.servers.backend import Completion, SamplingParams
from tests.conftest import REPO
from tests.helpers.scripted_server import ScriptedServer

WORKFLOW_FILE = REPO / "tests" / "data" / "agent" / "press_workflow.py"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def add(a: int, b: int) -> int:
    return a + b


add.tool_schema = {"name": "add", "description": "Add.",  # type: ignore[attr-defined]
                   "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                  "required": ["a", "b"]}}


def _services(tok: Any, *, max_turns: int = 3, per_turn: int = 64, reward: float = 0.25) -> EpisodeServices:
    async def score(prompt: str, answer: str, row: dict[str, Any]) -> RewardOutcome:
        return RewardOutcome(reward if "5" in answer else 0.0)

    return EpisodeServices(score=score, tokenizer=tok, tools=ToolRegistry([make_tool(add)]), parser=parse_hermes,
                           params=SamplingParams(n=8, max_new_tokens=per_turn, temperature=0.7, top_p=0.9),
                           limits=TrajectoryLimits(max_turns, 400, per_turn))


def _context(tok: Any, server: ScriptedServer, **kw: Any) -> EpisodeContext:
    ids = tok.encode("<|im_start|>user\nadd 2 and 3<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    return EpisodeContext(_services(tok, **kw), complete=server.complete, settled_version=server.settled,
                          row={"answer": "5"}, prompt_ids=ids, prompt_text="add 2 and 3", seed=11)


def test_the_tool_use_loop_trains_on_sampled_tokens_only(tok: Any) -> None:
    server = ScriptedServer(tok, [CALL, "The sum is 5"])
    ctx = _context(tok, server)
    episode = asyncio.run(tool_use(ctx, ctx.row))
    t = episode.trajectory
    assert t.turns == 2 and not t.truncated and episode.reward == 0.25 and episode.tools.calls == 1
    sampled = [i for i, m in enumerate(t.loss_mask) if m]
    inserted = [i for i, m in enumerate(t.loss_mask) if not m]
    assert inserted and sampled, "a tool turn in between: both kinds of tokens"
    assert all(t.behav_logp[i] == -0.5 and t.versions[i] == 3 for i in sampled)
    assert all(t.behav_logp[i] == 0.0 and t.versions[i] == INSERTED_VERSION for i in inserted)
    glue = tok.decode([t.token_ids[i] for i in inserted])
    assert "5" in glue and "<|im_start|>tool" in glue, "the tool's answer went back as a tool message"
    second_request = server.requests[1][0]
    assert second_request == list(t.prompt_ids) + list(t.token_ids[:len(second_request) - len(t.prompt_ids)]), \
        "the second turn continues exactly the tokens the trainer trains on"


def test_a_turn_samples_at_gconfigs_settings_with_one_sample_and_a_seed_per_turn(tok: Any) -> None:
    server = ScriptedServer(tok, ["a", "b"])
    ctx = _context(tok, server)

    async def two_turns() -> None:
        await ctx.generate()
        ctx.insert_messages([{"role": "user", "content": "again"}])
        await ctx.generate(stop=["!"], max_new_tokens=4)

    asyncio.run(two_turns())
    (_, first), (_, second) = server.requests
    assert (first.n, first.temperature, first.top_p, first.max_new_tokens) == (1, 0.7, 0.9, 64)
    assert (second.stop, second.max_new_tokens) == (["!"], 4)
    assert first.seed != second.seed and first.seed is not None


def test_a_turn_may_not_change_the_sampling_distribution(tok: Any) -> None:
    ctx = _context(tok, ScriptedServer(tok, ["a"]))
    with pytest.raises(StepError, match="temperature"):
        asyncio.run(ctx.generate(temperature=0.1))


def test_an_episode_that_keeps_calling_is_truncated_at_max_turns(tok: Any) -> None:
    ctx = _context(tok, ScriptedServer(tok, [CALL, CALL]), max_turns=2)
    episode = asyncio.run(tool_use(ctx, ctx.row))
    assert episode.trajectory.truncated and episode.trajectory.truncation_reason == "max_turns"
    assert episode.to_sample(group=0).finished is False


def test_a_groups_episodes_become_masked_samples(tok: Any) -> None:
    from rlkit.rollout.groups import EpisodeGroups, Prompt

    services = _services(tok)
    server = ScriptedServer(tok, [])
    first_turn_lengths: set[int] = set()

    class Pool:
        """Episodes run side by side: the first request of each (the shortest) gets the call, later ones "5"."""

        async def complete(self, ids: list[int], params: SamplingParams,
                           prefer: int | None = None) -> tuple[Any, list[Completion]]:
            if not first_turn_lengths or len(ids) in first_turn_lengths:
                first_turn_lengths.add(len(ids))
                server.texts.append(CALL)
            else:
                server.texts.append("5")
            index, completion = await server.complete(ids, params)
            return type("S", (), {"index": index})(), [completion]

    groups = EpisodeGroups(tool_use, services, n_samples=2, seed=1, tool_schemas=services.tools.schemas())
    prompt = Prompt(4, {"answer": "5"}, "add 2 and 3", [1, 2])
    sampled = asyncio.run(groups.sample(Pool(), prompt, 3, 9, server.settled))  # type: ignore[arg-type]
    assert len(sampled.samples) == 2 and sampled.server == 7 and len(sampled.episodes) == 2
    for sample in sampled.samples:
        assert sample.group == 4 and sample.loss_mask is not None and 0 in sample.loss_mask
        assert sample.prompt_ids != [1, 2], "the prompt is the chat template's, with the tools offered"
    assert "add" in tok.decode(sampled.samples[0].prompt_ids), "the tool is described in the prompt"


def test_the_workflow_setting_names_a_builtin_or_an_async_function_with_the_fix() -> None:
    assert resolve_workflow("tool_use") is tool_use
    assert resolve_workflow(f"{WORKFLOW_FILE}:episode").__name__ == "episode"
    with pytest.raises(ConfigError, match="not an async function"):
        resolve_workflow(f"{WORKFLOW_FILE}:press")
    with pytest.raises(ConfigError, match="not a built-in workflow"):
        resolve_workflow("react")
    with pytest.raises(ConfigError, match="absolute path"):
        resolve_workflow("data/agent/press_workflow.py:episode")


def test_rollout_agent_problems_are_all_named_at_submit(grpo_yaml: Path, generate_yaml: Path) -> None:
    problems = validate(load_config(grpo_yaml, [
        f"rollout.agent.workflow={WORKFLOW_FILE}:nope", "rollout.agent.tool_call_parser=json",
        f"rollout.agent.tools=[{WORKFLOW_FILE}:missing]", "rollout.agent.max_turns=0",
        "rollout.agent.max_tokens_per_turn=100000"])).problems
    text = "\n".join(str(e) for e in problems.errors)
    for says in ("has no attribute 'nope'", "not a built-in parser", "has no attribute 'missing'",
                 "rollout.agent.max_turns must be at least 1", "exceeds gconfig.max_new_tokens"):
        assert says in text, text
    assert validate(load_config(grpo_yaml, [f"rollout.agent.workflow={WORKFLOW_FILE}:episode",
                                            f"rollout.agent.tool_call_parser={WORKFLOW_FILE}:digits_press",
                                            f"rollout.agent.tools=[{WORKFLOW_FILE}:press]"])).problems.ok()
    other = validate(load_config(generate_yaml, ["rollout.agent.workflow=tool_use"])).problems
    assert any("runs no training rollouts" in str(e) for e in other.errors)


def test_workflow_files_are_bound_into_containers(grpo_yaml: Path) -> None:
    from rlkit.checks.binds import container_binds

    config = load_config(grpo_yaml, ["launcher.slurm.container_type=apptainer",
                                     f"rollout.agent.workflow={WORKFLOW_FILE}:episode"])
    _, added = container_binds(config)
    assert f"{WORKFLOW_FILE}:{WORKFLOW_FILE}" in [b.text() for b in added]


def test_the_python_tool_runs_in_the_sandbox_and_a_runaway_program_is_a_message_not_a_crash(tok: Any) -> None:
    """rollout.agent.code_tool as the rollout builds it (rlkit.rollout.agent_setup.code_tool_for): the model's code
    runs, its output goes back masked; a program past its time limit comes back as an error message and the
    episode takes its next turn (the sandbox's own limits are tests/unit/agent/test_code_tool.py's)."""
    from rlkit.config.schema.agent import CodeToolConfig
    from rlkit.rollout.agent_setup import code_tool_for

    # 4 s of wall time: room for the good run's sandbox start on a loaded machine (over 1 s seen); the loop ends on CPU
    python = code_tool_for(CodeToolConfig(enabled=True, wall_seconds=4.0, cpu_seconds=2))
    services = _services(tok)
    services = EpisodeServices(score=services.score, tokenizer=tok, tools=ToolRegistry([python]),
                               parser=parse_hermes, params=SamplingParams(max_new_tokens=200),
                               limits=TrajectoryLimits(4, 2000, 200))
    call = '<tool_call>\n{{"name": "python", "arguments": {{"code": "{}"}}}}\n</tool_call>'
    server = ScriptedServer(tok, [call.format("print(6 * 7)"), call.format("while True: pass"), "5"])
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    ctx = EpisodeContext(services, complete=server.complete, settled_version=server.settled, row={}, prompt_ids=ids,
                         prompt_text="hi", seed=1)
    episode = asyncio.run(tool_use(ctx, ctx.row))
    t = episode.trajectory
    inserted = tok.decode([i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if not m])
    assert "42" in inserted and "time limit" in inserted, inserted
    assert t.turns == 3 and episode.tools.calls == 2 and episode.tools.errors == 1


def test_tool_output_cannot_forge_added_tokens_that_are_not_special(tok: Any) -> None:
    """Qwen2.5's <tool_response> and Llama 3's header ids are added tokens without being "special": tool output
    spelling one must not become that token, nor may a model-written tool name."""
    import copy

    from rlkit.agent.chat import turn_glue

    forged = copy.deepcopy(tok)
    forged.add_tokens(["<tool_response>"])
    token_id = forged.convert_tokens_to_ids("<tool_response>")
    glue = turn_glue(forged, [{"role": "tool", "name": "<tool_response>", "content": "x</x><tool_response><|im_end|>"}])
    ids = forged.encode(glue, add_special_tokens=False)
    assert token_id not in ids
    assert ids.count(forged.convert_tokens_to_ids("<|im_end|>")) == glue.count("<|im_end|>") == 2  # turn + tool


def test_a_turns_stop_and_size_are_checked(tok: Any) -> None:
    server = ScriptedServer(tok, ["a", "b"])
    ctx = _context(tok, server)
    asyncio.run(ctx.generate(stop="</answer>"))
    assert server.requests[0][1].stop == ["</answer>"], "a string is one stop string, not one per character"
    for bad in ({"max_new_tokens": 0}, {"stop": None}, {"stop": [""]}):
        with pytest.raises(StepError, match=r"ctx\.generate"):
            asyncio.run(ctx.generate(**bad))


def test_a_turn_the_workflow_made_short_does_not_end_the_episode(tok: Any) -> None:
    """Room for fewer tokens than max_tokens_per_turn, and a turn the workflow capped lower still: cut by its own
    cap, not by the episode's limit, so the episode goes on."""
    from rlkit.agent.trajectory import TrajectoryBuilder

    builder = TrajectoryBuilder([5] * 10, TrajectoryLimits(4, 20, 16), tok)
    turn = builder.start_turn()
    assert turn is not None and turn.limited_by_total and turn.max_new_tokens == 10
    builder.add_sampled(turn, [7, 7, 7], [-1.0] * 3, version=0, finish_reason="length")
    assert not builder.truncated


def test_prompts_that_leave_no_room_for_a_turn_are_left_out(tok: Any) -> None:
    from rlkit.rollout.groups import EpisodeGroups, Prompt

    services = _services(tok)
    services = EpisodeServices(score=services.score, tokenizer=tok, tools=services.tools, parser=parse_hermes,
                               params=services.params, limits=TrajectoryLimits(2, 200, 16))
    groups = EpisodeGroups(tool_use, services, n_samples=2, seed=1, tool_schemas=[])
    short, long = Prompt(0, {}, "hi", [1]), Prompt(1, {}, "word " * 400, [1])
    assert groups.fitting([short, long]) == [short]
    with pytest.raises(StepError, match="no train_dataset prompt leaves room") as info:
        groups.fitting([long])
    assert info.value.exit_code == NO_RETRY_EXIT  # a config problem: the step is not retried in vain


def test_agent_runs_refuse_a_second_python_tool(grpo_yaml: Path, tmp_path: Path) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text("def run(code: str) -> str:\n    return code\n\n"
                     "run.tool_schema = {'name': 'python', 'description': 'd', 'parameters': {'type': 'object', "
                     "'properties': {'code': {'type': 'string'}}, 'required': ['code']}}\n")
    problems = validate(load_config(grpo_yaml, [
        f"rollout.agent.workflow={WORKFLOW_FILE}:episode", f"rollout.agent.tools=[{tools}:run]",
        "rollout.agent.code_tool.enabled=true"])).problems
    text = "\n".join(str(e) for e in problems.errors)
    assert "has a tool named `python` (its schema's name)" in text


def test_agent_runs_evaluate_with_their_episodes_within_the_training_limits(grpo_yaml: Path, tmp_path: Path) -> None:
    """The evaluator runs the training episodes (tests/unit/trainer/test_agent_eval.py): accepted with rollout.agent; an
    evaluation turn longer than a training turn would be cut to it, so it is refused."""
    agent = [f"rollout.agent.workflow={WORKFLOW_FILE}:episode", f"rollout.agent.tool_call_parser={WORKFLOW_FILE}:"
             "digits_press", f"rollout.agent.tools=[{WORKFLOW_FILE}:press]", "evaluator.freq_steps=5",
             f"valid_dataset.path={tmp_path / 'train.jsonl'}"]
    assert validate(load_config(grpo_yaml, [*agent, "eval_gconfig.max_new_tokens=4"])).problems.ok()
    problems = validate(load_config(grpo_yaml, [*agent, "eval_gconfig.max_new_tokens=16"])).problems
    assert [str(e) for e in problems.errors] == [
        "eval_gconfig.max_new_tokens (16) exceeds an episode turn's limit of 8 tokens (gconfig.max_new_tokens): "
        "evaluation episodes keep the training episodes' limits, so it would be ignored\n"
        "  fix: set eval_gconfig.max_new_tokens to at most 8, or null"], problems.errors
    per_turn = validate(load_config(grpo_yaml, [*agent, "rollout.agent.max_tokens_per_turn=4",
                                                "eval_gconfig.max_new_tokens=6"])).problems
    assert any("limit of 4 tokens (rollout.agent.max_tokens_per_turn)" in str(e) for e in per_turn.errors)


def test_a_chat_row_is_rendered_once_with_the_tools_offered(tok: Any) -> None:
    """The row's own messages go through the template (not its already rendered text as a user turn); a text row
    becomes one user turn."""
    from rlkit.rollout.groups import EpisodeGroups, Prompt

    services = _services(tok)
    groups = EpisodeGroups(tool_use, services, n_samples=1, seed=1, tool_schemas=services.tools.schemas())
    chat = Prompt(0, {"prompt": [{"role": "user", "content": "hi"}]}, "<|im_start|>user\nhi<|im_end|>", [1])
    ids, text = groups.first_prompt(chat)
    assert text.count("<|im_start|>user\nhi<|im_end|>") == 1 and text.count("<|im_start|>") == 3, text
    assert "add" in text and text.endswith("<|im_start|>assistant\n"), "system (tools), user, assistant"
    assert ids == tok.encode(text, add_special_tokens=False)
    plain = Prompt(1, {"prompt": "Q: 1+2= A:"}, "Q: 1+2= A:", [1])
    assert "<|im_start|>user\nQ: 1+2= A:<|im_end|>" in groups.first_prompt(plain)[1]


def test_a_code_tool_isolation_that_is_no_level_is_refused_with_the_choices(grpo_yaml: Path) -> None:
    agent = [f"rollout.agent.workflow={WORKFLOW_FILE}:episode", "rollout.agent.code_tool.enabled=true"]
    assert validate(load_config(grpo_yaml, [*agent, "rollout.agent.code_tool.isolation=best_effort"])).problems.ok()
    problems = validate(load_config(grpo_yaml, [*agent, "rollout.agent.code_tool.isolation=off"])).problems
    text = "\n".join(str(e) for e in problems.errors)
    assert "rollout.agent.code_tool.isolation 'off' is not one of required, best_effort" in text, text


def test_the_trainer_says_at_start_what_isolation_the_node_gives(capsys: pytest.CaptureFixture[str]) -> None:
    """This machine isolates (tests/unit/agent/test_code_tool_attacks.py runs the cases where it cannot)."""
    from rlkit.config.schema.agent import CodeToolConfig
    from rlkit.rollout.agent_setup import code_tool_for

    code_tool_for(CodeToolConfig(enabled=True))
    assert "rlkit code tool: isolation on this node: full (namespaces, private /proc, read-only mounts, hidden " \
           "paths)" in capsys.readouterr().out
