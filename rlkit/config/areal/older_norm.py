"""AReaL's older normalisation switches, read with the meaning they had (AReaL up to v0.3's PPOActorConfig):
`adv_norm: true|false` (default true), `group_adv_norm` (default false: the advantages normalised over the whole batch,
true: within each prompt's group), and `group_reward_norm` (each group's rewards to zero mean and unit std).

Deleting them is not neutral: `group_adv_norm: false` meant batch-level normalisation because `adv_norm` defaulted
on, while rlkit's `actor.adv_norm` defaults to null (off). So they become rlkit's sections with the same math:
masked (token-weighted) normalisation with the population std and eps 1e-5 for the advantages, the sample std and
eps 1e-9 for the rewards, as AReaL computed them.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.areal.accept import FoundKey
from rlkit.config.areal.rules import renamed
from rlkit.config.problems import Problems

OLDER = ("group_adv_norm", "group_reward_norm")
SWITCHES_BECOME_SECTIONS = ("actor.adv_norm",)  # a bool where rlkit has a section: the older form, not a mistake
_SECTION = {"adv_norm": "adv_norm", "group_adv_norm": "adv_norm", "group_reward_norm": "reward_norm"}


def _norm(level: str, *, unbiased: bool, eps: float) -> dict[str, Any]:
    return {"mean_level": level, "std_level": level, "mean_leave1out": False, "std_unbiased": unbiased, "eps": eps}


def _switch(name: str, value: Any, origin: str, problems: Problems) -> bool | None:
    if isinstance(value, bool):
        return value
    problems.add(f"AReaL key 'actor.{name}: {value!r}' ({origin}): AReaL's older switch takes true or false",
                 hint=f"set actor.{name} to true or false, or write actor.{_SECTION[name]} as a section "
                      "(mean_level, std_level)")
    return None


def translate_older_norm(data: dict[str, Any], overrides: dict[str, Any], origin: str,
                         problems: Problems) -> tuple[list[FoundKey], bool]:
    """Take the older switches out of `data`'s and `overrides`' actor sections, in place, judged together (overrides
    win, as everywhere); the found keys carry the sections they meant to rlkit's keys (rlkit.config.areal.accept.
    move_renamed) and name them in the notice and `migrate`. True: they belong with the overrides (one was there)."""
    sections = [s for s in (data.get("actor"), overrides.get("actor")) if isinstance(s, dict)]
    merged = {k: v for s in sections for k, v in s.items()}
    older_adv = "group_adv_norm" in merged or isinstance(merged.get("adv_norm"), bool)
    if not older_adv and "group_reward_norm" not in merged:
        return [], False
    over = overrides.get("actor")
    in_overrides = isinstance(over, dict) and any(k in over for k in (*OLDER, "adv_norm"))
    found: list[FoundKey] = []
    if older_adv:
        on = _switch("adv_norm", merged.get("adv_norm", True), origin, problems)
        group = _switch("group_adv_norm", merged.get("group_adv_norm", False), origin, problems)
        for section in sections:
            section.pop("group_adv_norm", None)
            if isinstance(section.get("adv_norm"), bool):
                section.pop("adv_norm")
        if on is not None and group is not None:
            value = _norm("group" if group else "batch", unbiased=False, eps=1e-5) if on else None
            key = "group_adv_norm" if "group_adv_norm" in merged else "adv_norm"
            why = (f"AReaL's older switches (adv_norm {'on' if on else 'off'}, group_adv_norm "
                   f"{str(group).lower()}): advantages normalised "
                   + (f"per {'group' if group else 'batch'}" if on else "not at all"))
            found.append(FoundKey(f"actor.{key}", value, renamed("actor.adv_norm", why), origin))
    if "group_reward_norm" in merged:
        group = _switch("group_reward_norm", merged["group_reward_norm"], origin, problems)
        for section in sections:
            section.pop("group_reward_norm", None)
        if group or (group is False and "reward_norm" not in merged):
            why = "AReaL's older switch: " + ("each group's rewards to zero mean and unit std" if group else "off")
            found.append(FoundKey("actor.group_reward_norm", _norm("group", unbiased=True, eps=1e-9) if group else None,
                                  renamed("actor.reward_norm", why), origin))
    return found, in_overrides
