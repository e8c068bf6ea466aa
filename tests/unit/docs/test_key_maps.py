"""The key maps of verl, Trinity-RFT, cosmos-rl, ChatLearn and TRL: every rlkit key they name is a key of the schema (a
field renamed in rlkit fails here), a key rlkit lacks says why, and each system's page lists every entry."""

from __future__ import annotations

from collections import Counter

from rlkit.cli.key_maps import SEEDS, KeyMap, render_key_maps, their_names, unknown_keys
from rlkit.cli.schema_docs import schema_docs


def test_every_rlkit_key_of_the_maps_is_in_the_schema() -> None:
    for system, (entries, _, _) in SEEDS.items():
        assert not unknown_keys(entries), (system, unknown_keys(entries))


def test_a_renamed_rlkit_key_is_caught() -> None:
    """What the test above relies on: a key missing from the schema is reported."""
    entries = (KeyMap("clip_ratio", "actor.eps_clip"), KeyMap("lr", "actor.optimizer.learning_rate"))
    assert unknown_keys(entries) == ["actor.optimizer.learning_rate"]


def test_a_key_rlkit_lacks_says_why_and_none_repeats() -> None:
    for system, (entries, _, _) in SEEDS.items():
        assert all(entry.note for entry in entries if not entry.ours), system
        repeated = [key for key, n in Counter(entry.their for entry in entries).items() if n > 1]
        assert not repeated, (system, repeated)
        assert len(entries) >= 30, f"{system}: the common knobs, not a handful"


def test_each_system_has_a_page_with_every_entry() -> None:
    pages = render_key_maps()
    for system, (entries, slug, _) in SEEDS.items():
        page = pages[f"coming-from/{slug}.md"]
        assert all(f"| `{entry.their}` |" in page for entry in entries), system


def test_their_names_reach_rlkits_key() -> None:
    assert ("verl", "actor_rollout_ref.actor.clip_ratio", "") in their_names("actor.eps_clip")
    assert all(path in schema_docs() for path in ("actor.eps_clip", "gconfig.n_samples"))
    assert {system for system, _, _ in their_names("gconfig.n_samples")} == set(SEEDS)


def test_trl_s_loss_knobs_reach_rlkit_s() -> None:
    """TRL's names of the loss (its loss_type cispo and sapo, the two-sided clip) say where rlkit has them."""
    names = {their: note for system, their, note in their_names("actor.loss_agg_mode") if system == "TRL"}
    assert "cispo: actor.policy_loss cispo" in names["loss_type"] and "sapo: actor.use_sapo_loss" in names["loss_type"]
    assert [their for system, their, _ in their_names("actor.c_clip") if system == "TRL"] == ["delta"]
