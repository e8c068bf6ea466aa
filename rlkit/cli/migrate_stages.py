"""`rlkit migrate` of a file that becomes a staged rlkit file (Trinity-RFT's `stages:`, rlkit.config.trinity_stages):
AReaL's reading (rlkit.config.areal.migrate) takes one stage's keys, so the staged mapping is written as it stands,
the command line's overrides merged in, and checked as `rlkit render` checks a staged file: every stage composed,
validated, planned and rendered (rlkit.launch.stages.prepare_stages, a dry run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from rlkit.config.load import parse_overrides, read_yaml
from rlkit.launch.stages import STAGES_KEY, has_stages, prepare_stages

__all__ = ["has_stages", "migrate_staged"]


def migrate_staged(path: Path, overrides: list[str]) -> tuple[str, list[str]]:
    """The text of the staged rlkit file `path` with `overrides` merged in (key=value: the top level;
    stages.<name>.key=value: that stage), and the warnings (site files missing here, each stage's notes);
    ConfigErrors as render raises them."""
    plans, missing = prepare_stages(path, overrides, dry_run=True)
    warnings = [error.message for error in missing] + [f"stage {plan.record.name}: {note}" for plan in plans
                                                       for note in plan.prepared.notes]
    data = read_yaml(path)
    common = [item for item in overrides if not item.startswith(f"{STAGES_KEY}.")]
    stages = data.pop(STAGES_KEY)
    merged = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(data),
                                                                         parse_overrides(common))))
    for stage in stages:
        own = [item[len(f"{STAGES_KEY}.{stage['stage_name']}."):] for item in overrides
               if item.startswith(f"{STAGES_KEY}.{stage['stage_name']}.")]
        stage.update(cast(dict[str, Any], OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(stage),
                                                                                 parse_overrides(own)))))
    merged[STAGES_KEY] = stages
    return OmegaConf.to_yaml(merged), warnings
