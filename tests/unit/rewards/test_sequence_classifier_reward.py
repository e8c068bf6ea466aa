"""A reward model trained elsewhere (a Hugging Face `*ForSequenceClassification` with one label) as `reward.fn:
reward_model`: told apart from rw's by its directory, it reads the conversation through its own chat template (the
row's prompt messages, or the prompt text as a user message, then the completion as the assistant's; plain text
without a template) and scores with its logit at the last token. Checked against transformers computing the same
thing directly (the model's own forward), and at submit: accepted without rw's note, with its own tokenizer and
vocabulary; a causal LM refused naming both forms. Served, the same ids go to vLLM (tests/integration/
test_reward_model_servers.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlkit.config.model_config import SEQUENCE_CLASSIFIER, reward_model_format
from rlkit.rewards.model_reward import reward_model_score, scored_ids


@pytest.fixture(scope="module")
def classifier_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("seq-rm") / "rm"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1, dtype=torch.float32)
        torch.nn.init.normal_(model.score.weight, std=0.5)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def test_the_directory_says_which_form_it_is(classifier_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    assert reward_model_format(str(classifier_dir)) == SEQUENCE_CLASSIFIER
    assert reward_model_format(str(tiny_model_dir)) == ""  # a causal LM
    two = tmp_path / "two"
    two.mkdir()
    config = json.loads((classifier_dir / "config.json").read_text())
    (two / "config.json").write_text(json.dumps({**config, "id2label": {"0": "a", "1": "b"}, "num_labels": 2}))
    assert reward_model_format(str(two)) == ""  # two labels: no one score


def test_it_reads_the_conversation_through_its_chat_template(classifier_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(classifier_dir)
    messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "9+9="}]
    expected = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": "18"}], tokenize=False)
    ids = scored_ids(str(classifier_dir), "ignored: the row's messages win", "18", {"question": messages}, "question")
    assert tokenizer.decode(ids) == expected
    ids = scored_ids(str(classifier_dir), "3+4=", "7", {"prompt": "3+4="}, "prompt")
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(
        [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}], tokenize=False)


def test_it_scores_with_its_logit_at_the_last_token(classifier_dir: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(classifier_dir, dtype=torch.float32).eval()
    scores = []
    for completion in ("7", "8 or so", "seven"):
        row = {"prompt": "3+4="}
        ids = scored_ids(str(classifier_dir), "3+4=", completion, row, "prompt")
        assert model.config.pad_token_id not in ids  # transformers' own class reads the last token then
        with torch.no_grad():
            direct = model(input_ids=torch.tensor([ids])).logits[0, 0].item()
        score = reward_model_score("3+4=", completion, row, model_path=str(classifier_dir))
        assert score == pytest.approx(direct, abs=1e-5)
        scores.append(score)
    assert len({round(s, 4) for s in scores}) == 3


def test_submit_accepts_it_and_refuses_a_causal_lm_naming_both_forms(classifier_dir: Path, tiny_model_dir: Path
                                                                      ) -> None:
    from rlkit.checks.reward_model import validate_reward_model
    from rlkit.config.load import config_from_mapping
    from rlkit.config.problems import Problems

    def problems_for(path: Path) -> list[str]:
        config = config_from_mapping({"experiment_name": "e", "trial_name": "t", "type": "grpo",
                                      "allocation_mode": "vllm:d1+fsdp:d1", "actor": {"path": str(tiny_model_dir)},
                                      "reward": {"fn": "reward_model", "reward_model_path": str(path)}})
        problems = Problems()
        validate_reward_model(config, problems)
        return [e.message for e in problems.errors]

    assert problems_for(classifier_dir) == []
    said = problems_for(tiny_model_dir)
    assert len(said) == 1 and "is neither a reward model written by job type rw" in said[0]
    assert "nor a Hugging Face sequence classifier with one label" in said[0]


def test_an_encoder_classifier_scores_as_its_own_forward_pools(classifier_dir: Path, tmp_path: Path) -> None:
    """A single-label encoder (BERT, DeBERTa: OpenAssistant's reward models) has no `score` head and pools its first
    token: accepted at submit, it must score as its own forward does, not fail every call."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(classifier_dir)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, num_labels=1, max_position_embeddings=128)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BertForSequenceClassification(config).eval()
    out = tmp_path / "bert-rm"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    assert reward_model_format(str(out)) == SEQUENCE_CLASSIFIER
    row = {"prompt": "3+4="}
    ids = scored_ids(str(out), "3+4=", "7", row, "prompt")
    with torch.no_grad():
        direct = model(input_ids=torch.tensor([ids])).logits[0, 0].item()
    assert reward_model_score("3+4=", "7", row, model_path=str(out)) == pytest.approx(direct, abs=1e-5)
