"""verl's keys that say what the run's prompts are made of and which rows it trains on, for `rlkit migrate`
(rlkit.config.verl.rules calls these before its generic rows). They once were "unknown" with exit 0: a
vision-language run migrated into a text-only one, a run whose long prompts verl cut migrated into one that drops them,
and a run on a random subset of its rows into one on every row. Each is now refused naming why, or left out saying why
nothing learned changes. verl's semantics: verl/utils/dataset/rl_dataset.py (RLHFDataset) and
verl/trainer/ppo/ray_trainer.py; defaults: verl/trainer/config/data/legacy_data.yaml."""

from __future__ import annotations

from typing import Any

from rlkit.config.verl.mapping import RunMapping, is_count

ACTOR = "actor_rollout_ref.actor"
# what makes a run vision-language: RLHFDataset._build_messages pops each row's image_key and video_key columns into
# the chat messages for the model's processor; image_patch_size and return_multi_modal_inputs only shape them
MULTIMODAL = ("data.image_key", "data.video_key", "data.image_patch_size", "data.return_multi_modal_inputs")
# their defaults (verl/trainer/config/data/legacy_data.yaml), which a whole config file (a Hydra dump) spells out for
# a text-only run as well
MULTIMODAL_DEFAULTS = {"data.image_key": "images", "data.video_key": "videos", "data.image_patch_size": 14,
                       "data.return_multi_modal_inputs": True}
TRUNCATIONS = {"left": "its last", "right": "its first", "middle": "the first and last halves of"}
# (key, why it changes nothing learned): read by verl but not by what the run learns
LEFT_OUT = {
    "data.use_shm": "how verl copies the data files to the nodes",
    "data.filter_overlong_prompts_workers": "processes of verl's filter (speed only)",
    "data.validation_shuffle": "the order of the validation rows: the same scores",
    "data.return_raw_input_ids": "the prompt's ids without the chat template, for a reward model of another template",
    "data.return_full_prompt": "the rendered prompt kept beside the batch, for logging",
    "data.seed": "the seed of verl's shuffle (verl/trainer/main_ppo.py create_rl_sampler): rlkit shuffles by its own "
                 "seed",
    "data.tokenizer": "not read by verl's trainer: verl/trainer/main_ppo.py tokenizes with the model's "
                      "(actor_rollout_ref.model.path)",
    "data.custom_cls.name": "the class of data.custom_cls.path, read with it",
    "data.sampler.class_name": "the class of data.sampler.class_path, read with it",
    "data.datagen.path": "read by verl's DynamicGenDataset only, a data.custom_cls.path (refused when set)",
    "data.datagen.name": "read by verl's DynamicGenDataset only, a data.custom_cls.path (refused when set)",
}


def data_inputs(m: RunMapping) -> None:
    """The run's images and videos, long prompts, subsets of rows and prompts per step, and data's other knobs."""
    _multimodal(m)
    _truncation(m)
    _subsets(m)
    for key, why in LEFT_OUT.items():
        if key in m.leaves and key not in m.done:
            m.left(key, why)
    kwargs = "data.apply_chat_template_kwargs"
    if m.leaves.get(kwargs, 0) in ({}, None):  # its keys, when set, are refused (learning.NOT_BUILT_SECTIONS)
        m.left(kwargs, "empty: the chat template's defaults, as rlkit renders it")


def _multimodal(m: RunMapping) -> None:
    """A vision-language run is refused: rlkit trains text-only models, and the run would learn from the text alone."""
    why = ("a vision-language run: verl gives each row's images and videos (data.image_key, data.video_key columns) to "
           "the model's processor with the prompt (verl/utils/dataset/rl_dataset.py RLHFDataset._build_messages); "
           "rlkit trains text-only models, so the migrated run would learn from the text alone")
    fix = "a vision-language run cannot move to rlkit; if the rows hold no images or videos (a text-only run), " \
          "remove it"
    for key in MULTIMODAL:
        if key not in m.leaves:
            continue
        if m.whole_config and m.leaves[key] == MULTIMODAL_DEFAULTS[key]:
            m.left(key, "verl's default, which a whole config file writes for a text-only run too; rows holding "
                        "images or videos make a vision-language run, which rlkit does not train (it reads the "
                        "rows' text)")
        else:
            m.refuse(key, why, fix)
    tower = f"{ACTOR}.freeze_vision_tower"
    if tower in m.leaves:
        if m.leaves[tower] in (False, None):
            m.left(tower, "false: verl's default (a text model has no vision tower)")
        else:
            m.refuse(tower, why, fix)


def _truncation(m: RunMapping) -> None:
    """data.truncation: what verl does with a prompt over data.max_prompt_length, against rlkit's dropping it
    (rlkit.jobs.grpo.algorithm.load_prompts: train_dataset.max_length)."""
    key = "data.truncation"
    if key not in m.leaves:
        return
    value = m.leaves[key]
    if m.leaves.get("data.filter_overlong_prompts") is True:  # verl's default is False (legacy_data.yaml)
        m.left(key, "data.filter_overlong_prompts drops every prompt over data.max_prompt_length first "
                    "(RLHFDataset.maybe_filter_out_long_prompts), as rlkit does: none is left to truncate")
    elif value == "error":
        m.left(key, "error: verl stops at a prompt over data.max_prompt_length (RLHFDataset.__getitem__ raised; since "
                    "verl's agent-loop rollout such a prompt cannot be batched: verl/experimental/agent_loop/"
                    "agent_loop.py _postprocess), so a run verl completes has none, and rlkit's dropping of such "
                    "prompts drops none")
    elif isinstance(value, str) and value in TRUNCATIONS:
        m.refuse(key, f"verl keeps {TRUNCATIONS[value]} data.max_prompt_length tokens of a longer prompt and trains "
                      "on it (verl/utils/dataset/rl_dataset.py RLHFDataset.__getitem__ before verl's agent-loop "
                      "rollout, which reads no truncation); rlkit drops such prompts (train_dataset.max_length)",
                 "set data.filter_overlong_prompts=True to drop them as rlkit does, or cut the prompts in the data "
                 "file and set data.truncation=error")
    else:
        m.refuse(key, "not one of verl's truncations (error, left, right, middle)", "e.g. data.truncation=error")


def _subsets(m: RunMapping) -> None:
    """data.train_max_samples (a random subset of the rows) and data.gen_batch_size (prompts per step)."""
    leaves = m.leaves
    key = "data.train_max_samples"
    if key in leaves:
        n: Any = leaves[key]
        if n is None or (isinstance(n, int) and not isinstance(n, bool) and n <= 0):
            m.left(key, f"{n}: every row, verl's default")
        else:
            m.refuse(key, "verl trains on that many rows drawn at random from the file "
                          "(RLHFDataset._read_files_and_tokenize); rlkit trains on every row",
                     "write those rows to a file of their own, give it as data.train_files (or train_dataset.path) "
                     "and remove data.train_max_samples")
    key = "data.val_max_samples"
    if key in leaves:
        m.left(key, "evaluation only (nothing learned): verl scores that many rows drawn at random, rlkit every row of "
                    "valid_dataset")
    key, batch = "data.gen_batch_size", leaves.get("data.train_batch_size", 1024)
    if key in leaves:
        if leaves[key] in (None, batch):
            m.left(key, "data.train_batch_size's, as verl's default")
        elif is_count(leaves[key]):
            m.refuse(key, "verl's loader draws this many prompts per step and the step trains on them all "
                          "(verl/trainer/ppo/ray_trainer.py _create_dataloader), not data.train_batch_size",
                     f"set data.train_batch_size={leaves[key]} and leave gen_batch_size out")
        else:
            m.refuse(key, "not a whole number > 0", "e.g. data.gen_batch_size=512")
