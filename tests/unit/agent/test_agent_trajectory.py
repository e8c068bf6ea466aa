"""Token-exact trajectories with the project's tiny tokenizer: masks, log-probs and versions line up with the ids
the server returned; limits end episodes flagged truncated; every planted difference raises TrajectoryMismatch;
and re-tokenizing the conversation text gives other ids than the trajectory (why it is built token-exact)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from rlkit.agent.chat import closing_token_text, messages_with_tool_text, render_prompt, turn_glue
from rlkit.agent.episode import Episode, ToolTally
from rlkit.agent.metrics import batch_metrics, episode_metrics
from rlkit.agent.tool_calls import parse_hermes, tool_message
from rlkit.agent.tools import ToolResult
from rlkit.agent.trajectory import (
    INSERTED_VERSION,
    InsertedSegment,
    SampledSegment,
    TrajectoryBuilder,
    TrajectoryLimits,
    TrajectoryMismatch,
)
from rlkit.types import Sample

ADD = {"name": "add", "description": "Add two integers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
LIMITS = TrajectoryLimits(max_turns=4, max_total_tokens=1000, max_tokens_per_turn=100)


def encode(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def char_tokens(tok: Any, text: str) -> list[int]:
    """A valid tokenization the tiny (random) model may sample but BPE would never produce: one token a byte."""
    return [i for ch in text for i in encode(tok, ch)]


def fake_logprobs(n: int, offset: float = 0.0) -> list[float]:
    return [-0.5 - offset - 0.01 * i for i in range(n)]


def two_turn_episode(tok: Any) -> tuple[TrajectoryBuilder, str]:
    """Turn 0 calls the tool (sampled one byte a token, at version 3), the result goes back, turn 1 answers
    (version 4). Returns the builder and the conversation's text."""
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = render_prompt(tok, [{"role": "user", "content": "What is 17+25?"}], [ADD])
    b = TrajectoryBuilder(encode(tok, prompt), LIMITS, tok)
    turn = b.start_turn()
    assert turn is not None and turn.request_ids == tuple(encode(tok, prompt)) and turn.max_new_tokens == 100
    first = [*char_tokens(tok, CALL_TEXT), im_end]
    b.add_sampled(turn, first, fake_logprobs(len(first)), version=3, finish_reason="stop",
                  server_request_ids=turn.request_ids)
    calls = parse_hermes(tok.decode(first, skip_special_tokens=True)).calls
    assert closing_token_text(tok, first) == "<|im_end|>" and closing_token_text(tok, first[:-1]) == ""
    glue = turn_glue(tok, [tool_message(calls[0], "42")], turn_closed_with=closing_token_text(tok, first))
    assert b.add_inserted(glue)
    turn = b.start_turn()
    assert turn is not None
    second = [*encode(tok, "The answer is 42."), im_end]
    b.add_sampled(turn, second, fake_logprobs(len(second), 1.0), version=4, finish_reason="stop")
    return b, prompt + CALL_TEXT + "<|im_end|>" + glue + "The answer is 42.<|im_end|>"


def test_two_turn_trajectory_is_token_exact(tok: Any) -> None:
    b, conversation = two_turn_episode(tok)
    t = b.build()
    first, glue, second = t.segments
    assert isinstance(first, SampledSegment) and isinstance(glue, InsertedSegment)
    assert isinstance(second, SampledSegment) and t.turns == 2 and not t.truncated
    assert t.token_ids == first.token_ids + glue.token_ids + second.token_ids
    assert glue.token_ids == tuple(encode(tok, glue.text))  # inserted text: tokenized once, by rlkit
    n1, ng, n2 = len(first.token_ids), len(glue.token_ids), len(second.token_ids)
    assert t.loss_mask == (1,) * n1 + (0,) * ng + (1,) * n2
    assert t.behav_logp == (*first.logprobs, *[0.0] * ng, *second.logprobs)
    assert t.versions == (3,) * n1 + (INSERTED_VERSION,) * ng + (4,) * n2
    assert tok.decode(t.prompt_ids + t.token_ids) == conversation
    assert glue.text == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


def test_retokenizing_the_conversation_gives_other_ids(tok: Any) -> None:
    """The counter-example: the decoded conversation, tokenized again (or rendered again from chat messages by the
    template), is the same text but not the same ids, so a trainer doing it trains on tokens nobody sampled."""
    b, conversation = two_turn_episode(tok)
    t = b.build()
    exact = list(t.prompt_ids + t.token_ids)
    again = encode(tok, tok.decode(exact))
    assert tok.decode(again) == tok.decode(exact) == conversation
    assert again != exact and len(again) < len(exact)  # BPE merged what the model sampled byte by byte
    messages = [{"role": "user", "content": "What is 17+25?"}, {"role": "assistant", "content": CALL_TEXT},
                {"role": "tool", "content": "42"}, {"role": "assistant", "content": "The answer is 42."}]
    rendered = tok.apply_chat_template(messages_with_tool_text(messages, [ADD]), tokenize=False)
    assert rendered == conversation + "\n"  # the template closes the last turn with a newline nobody sampled
    assert encode(tok, rendered)[:-1] != exact
    # and at a segment boundary: a sampled space then inserted text merges into one token when re-tokenized
    plain = TrajectoryBuilder(encode(tok, "Q: 3+4= A:"), LIMITS, tok)
    turn = plain.start_turn()
    assert turn is not None
    plain.add_sampled(turn, encode(tok, " "), [-0.1], version=0, finish_reason="stop")
    plain.add_inserted("seven")
    boundary = plain.build()
    assert encode(tok, tok.decode(boundary.token_ids)) != list(boundary.token_ids)
    assert tok.convert_ids_to_tokens(encode(tok, " seven")) == ["Ġseven"]


def test_episode_to_sample_and_metrics(tok: Any) -> None:
    b, _ = two_turn_episode(tok)
    tally = ToolTally()
    tally.add_results([ToolResult("add", True, "42", 0.25)])
    tally.add_unparsed(1)
    episode = Episode(b.build(), reward=1.0, tools=tally)
    sample = episode.to_sample(group=7, server=1)
    t = episode.trajectory
    assert sample.completion_ids == list(t.token_ids) and sample.loss_mask == list(t.loss_mask)
    assert sample.token_versions == list(t.versions) and sample.behav_logp == list(t.behav_logp)
    assert sample.version == 3 and sample.finished and sample.group == 7 and sample.server == 1
    assert sample.length == len(t.prompt_ids) + len(t.token_ids)
    m = episode_metrics(episode)
    assert m["turns"] == 2 and m["tool_calls"] == 2 and m["tool_errors"] == 1 and m["tool_seconds"] == 0.25
    assert m["trained_tokens"] == sum(t.loss_mask) and m["masked_tokens"] == len(t.loss_mask) - sum(t.loss_mask)
    quiet = Episode(TrajectoryBuilder([1, 2], LIMITS, tok).build(), reward=0.0)
    batch = batch_metrics([episode, quiet])
    assert batch["agent/used_tools"] == 0.5 and batch["agent/turns"] == 1.0 and batch["agent/truncated"] == 0.0
    assert batch["agent/masked_fraction"] == m["masked_tokens"] / len(t.loss_mask) and batch_metrics([]) == {}
    assert quiet.version == -1


def test_sample_defaults_keep_single_turn_callers_unchanged() -> None:
    sample = Sample([1], [2, 3], [-0.1, -0.2], 1.0, 0, True, 0)
    assert sample.loss_mask is None and sample.token_versions is None


def test_max_turns_flags_truncation(tok: Any) -> None:
    b = TrajectoryBuilder([5, 6], TrajectoryLimits(max_turns=1, max_total_tokens=100, max_tokens_per_turn=10), tok)
    turn = b.start_turn()
    assert turn is not None
    b.add_sampled(turn, [7, 8], [-1.0, -1.0], version=0, finish_reason="stop")
    assert b.add_inserted("ok") and b.next_turn_budget() == 0 and not b.truncated
    assert b.start_turn() is None and b.build().truncation_reason == "max_turns"


def test_a_turn_cut_by_the_per_turn_limit_goes_on_and_only_a_last_cut_turn_flags_the_episode(tok: Any) -> None:
    b = TrajectoryBuilder([5, 6], TrajectoryLimits(max_turns=3, max_total_tokens=100, max_tokens_per_turn=3), tok)
    turn = b.start_turn()
    assert turn is not None and turn.max_new_tokens == 3 and not turn.limited_by_total
    b.add_sampled(turn, [7, 8, 9], [-1.0] * 3, version=0, finish_reason="length")
    assert not b.truncated and b.next_turn_budget() == 3, "the workflow may go on after a cut turn"
    assert b.build().truncation_reason == "max_tokens_per_turn", "ending on a cut turn: flagged"
    assert b.add_inserted("ok")
    second = b.start_turn()
    assert second is not None
    b.add_sampled(second, [7], [-1.0], version=0, finish_reason="stop")
    assert not b.build().truncated, "a cut turn in the middle of a finished episode is no truncation"


def test_total_limit_caps_the_next_turn_and_inserted_text(tok: Any) -> None:
    b = TrajectoryBuilder([5] * 5, TrajectoryLimits(max_turns=5, max_total_tokens=12, max_tokens_per_turn=4), tok)
    assert b.next_turn_budget() == 4 and len(encode(tok, "ab")) == 2
    turn = b.start_turn()
    assert turn is not None
    b.add_sampled(turn, [7, 8], [-1.0] * 2, version=0, finish_reason="stop")
    assert b.next_turn_budget() == 4 and b.add_inserted("ab") and b.total_tokens == 9
    turn = b.start_turn()
    assert turn is not None and turn.max_new_tokens == 3 and turn.limited_by_total
    b.add_sampled(turn, [7, 8, 9], [-1.0] * 3, version=1, finish_reason="length")
    assert b.truncation_reason == "max_total_tokens" and b.total_tokens == 12
    full = TrajectoryBuilder([5] * 6, TrajectoryLimits(max_turns=5, max_total_tokens=8, max_tokens_per_turn=4), tok)
    assert not full.add_inserted("The quick brown fox") and full.truncation_reason == "max_total_tokens"
    assert full.build().token_ids == ()  # nothing appended past the limit
    ended = TrajectoryBuilder([5] * 8, TrajectoryLimits(max_turns=5, max_total_tokens=8, max_tokens_per_turn=4), tok)
    assert ended.start_turn() is None and ended.truncation_reason == "max_total_tokens"


def test_limits_must_be_positive_integers() -> None:
    with pytest.raises(ValueError, match=r"max_turns=0, max_tokens_per_turn=True"):
        TrajectoryLimits(max_turns=0, max_total_tokens=10, max_tokens_per_turn=True)


def started(tok: Any) -> tuple[TrajectoryBuilder, Any]:
    b = TrajectoryBuilder([5, 6, 7], LIMITS, tok, vocab_size=len(tok))
    turn = b.start_turn()
    assert turn is not None
    return b, turn


def test_mismatch_server_was_given_other_ids(tok: Any) -> None:
    """Planted: the client sent the re-tokenized conversation instead of the trajectory's ids."""
    b, _ = two_turn_episode(tok)
    assert b.add_inserted("\n<|im_start|>user\nAnd 1+1?<|im_end|>\n<|im_start|>assistant\n")
    turn = b.start_turn()
    assert turn is not None
    retokenized = encode(tok, tok.decode(list(turn.request_ids)))
    with pytest.raises(TrajectoryMismatch, match=r"turn 2: the server reports other prompt ids than it was sent: "
                                                 r"lengths \d+ and \d+, first difference at position \d+"):
        b.add_sampled(turn, [9], [-0.1], version=5, finish_reason="stop", server_request_ids=retokenized)


@pytest.mark.parametrize(("ids", "logps", "expected"), [
    ([9, 9], [-0.1], "2 token ids but 1 log-probs"),
    ([9] * 101, [-0.1] * 101, "returned 101 tokens, more than the 100 asked for"),
    ([9, 512], [-0.1, -0.1], r"not an integer in \[0, 512\)"),
    ([9, -1], [-0.1, -0.1], "not an integer"),
    ([9], [float("nan")], "NaN log-probs"),
])
def test_mismatch_in_what_the_server_returned(tok: Any, ids: list[int], logps: list[float], expected: str) -> None:
    b, turn = started(tok)
    with pytest.raises(TrajectoryMismatch, match=expected):
        b.add_sampled(turn, ids, logps, version=0, finish_reason="stop")


def test_mismatch_in_the_order_of_calls(tok: Any) -> None:
    b, turn = started(tok)
    with pytest.raises(TrajectoryMismatch, match="inserted while its request is in flight"):
        b.add_inserted("x")
    with pytest.raises(TrajectoryMismatch, match=r"build\(\) while its request is in flight"):
        b.build()
    b.add_sampled(turn, [9], [-0.1], version=0, finish_reason="stop")
    with pytest.raises(TrajectoryMismatch, match="not the pending one"):
        b.add_sampled(turn, [9], [-0.1], version=0, finish_reason="stop")  # the same completion twice
    stale = b.start_turn()
    assert stale is not None
    b._ids.append(10)  # planted: a token slipped in after the request was made
    with pytest.raises(TrajectoryMismatch, match="the trajectory changed after the request was made"):
        b.add_sampled(stale, [9], [-0.1], version=0, finish_reason="stop")


def test_verify_catches_a_changed_or_merged_token(tok: Any) -> None:
    b, turn = started(tok)
    b.add_sampled(turn, [40, 41], [-0.1, -0.2], version=0, finish_reason="stop")
    b.add_inserted("seven")
    b._ids[1] = 99  # planted: the sampled ids changed after the fact
    with pytest.raises(TrajectoryMismatch, match=r"segment 0 \(sampled\) differs from the trajectory's ids: "
                                                 r"lengths 2 and 2, first difference at position 1"):
        b.build()
    b._ids[1] = 41
    b._ids[1:3] = [123]  # planted: two tokens across the boundary merged into one
    with pytest.raises(TrajectoryMismatch, match=r"segment 0 \(sampled\) differs"):
        b.build()


def test_agent_modules_import_without_torch_or_transformers() -> None:
    program = ("import sys, rlkit.agent.chat, rlkit.agent.episode, rlkit.agent.metrics, rlkit.agent.tool_calls, "
               "rlkit.agent.tools, rlkit.agent.trajectory; "
               "print(json.dumps(sorted({'torch', 'transformers'} & {m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", "import json; " + program], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
