"""Values are read as the user wrote them (no YAML 1.1 traps), and Slurm times are parsed and normalised by rlkit."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.config.load import load_config, parse_overrides, to_yaml
from rlkit.config.yaml_text import load_yaml
from rlkit.errors import ConfigError
from rlkit.slurm.time_limits import format_slurm_time, slurm_time_seconds
from tests.conftest import raise_problems
from tests.helpers.planning import plan_of

TRAPS = """
time: 1:30:00
octal: 007
octal_new: 0o17
hex: 0x1F
underscored: 1_000
switch: on
answer: yes
sexagesimal_float: 1:30.5
"""


def test_yaml_1_1_traps_stay_text() -> None:
    assert load_yaml(TRAPS) == {"time": "1:30:00", "octal": "007", "octal_new": "0o17", "hex": "0x1F",
                                "underscored": "1_000", "switch": "on", "answer": "yes",
                                "sexagesimal_float": "1:30.5"}


def test_plain_numbers_and_booleans_still_are() -> None:
    assert load_yaml("a: 42\nb: -3\nc: 0\nd: 0.5\ne: 1.5e-3\nf: true\ng: False\nh: .inf\ni: null\nj: '7'") == {
        "a": 42, "b": -3, "c": 0, "d": 0.5, "e": 1.5e-3, "f": True, "g": False, "h": float("inf"), "i": None,
        "j": "7"}


def test_overrides_read_like_the_file() -> None:
    cfg = parse_overrides(["launcher.slurm.time=1:30:00", "trial_name=007", "a.b=[1,2]", "a.c=", "seed=3",
                           "x=${oc.env:HOME}"])
    assert cfg.launcher.slurm.time == "1:30:00" and cfg.trial_name == "007" and cfg.seed == 3
    assert list(cfg.a.b) == [1, 2] and cfg.a.c == ""
    assert cfg._get_node("x")._value() == "${oc.env:HOME}"  # interpolations still resolve later
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_overrides(["a=[unclosed"])


def test_nesting_past_a_config_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    """PyYAML's parser, OmegaConf and the checks recurse: "[[[[..." thousands deep ended in a RecursionError."""
    import yaml

    from rlkit.config.load import read_yaml
    from rlkit.config.yaml_text import MAX_DEPTH

    deepest = load_yaml("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))["a"]  # the mapping and 31 lists
    for _ in range(MAX_DEPTH - 2):
        deepest = deepest[0]
    assert deepest == []
    with pytest.raises(yaml.YAMLError, match=f"more than {MAX_DEPTH} levels"):
        load_yaml("a: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH)
    shared = "x: &x [[1]]\n" + "".join(f"k{i}: *x\n" for i in range(1000))  # an alias counts where it is used
    assert len(load_yaml(shared)) == 1001
    for deep in ("a: " + "[" * 5000 + "]" * 5000, "".join(" " * i + f"k{i}:\n" for i in range(3000))):
        path = tmp_path / "deep.yaml"
        path.write_text(deep)
        with pytest.raises(ConfigError, match="is not valid YAML: it is nested deeper than"):
            read_yaml(path)
    with pytest.raises(ConfigError, match=r"characters\)': the value is not valid YAML \(it is nested deeper"):
        parse_overrides(["actor.path=" + "[" * 5000 + "]" * 5000])
    with pytest.raises(ConfigError, match="levels deep"):
        parse_overrides(["a." * 100 + "b=1"])  # OmegaConf recursed past Python's stack on a key of 100 parts
    with pytest.raises(ConfigError, match=f"key and value are nested more than {MAX_DEPTH}"):
        parse_overrides(["a." * 20 + "b=" + "[" * 20 + "]" * 20])
    for looped in ("a: &a [*a]\n", "seed: 1\nactor: &a {path: *a}\n"):  # a value inside itself
        with pytest.raises(yaml.YAMLError, match="refers to itself through an alias"):
            load_yaml(looped)


def test_a_key_written_twice_is_refused_and_a_merge_may_override(tmp_path: Path) -> None:
    """PyYAML kept the last of two `actor:` sections silently, dropping everything the first set."""
    from rlkit.config.load import read_yaml

    config = tmp_path / "twice.yaml"
    config.write_text("actor:\n  path: /m\nseed: 1\nactor:\n  dtype: float32\n")
    with pytest.raises(ConfigError, match=r"at line 4, column 1: the key 'actor' is written twice in one mapping "
                                          r"\(first at line 1\)"):
        read_yaml(config)
    assert load_yaml("base: &b {x: 1, y: 2}\nactor: {<<: *b, x: 3}\n")["actor"] == {"x": 3, "y": 2}


@pytest.mark.parametrize(("override", "says"), [
    ("vllm.extra_args=[1]", "wrong type for 'vllm.extra_args' (in a command-line override): a mapping is expected, "
                            "not a list"),
    ("gconfig.stop={a: 1}", "wrong type for 'gconfig.stop' (in a command-line override): a list is expected, not a "
                            "mapping"),
])
def test_a_list_for_a_mapping_field_is_named(grpo_yaml: Path, override: str, says: str) -> None:
    """OmegaConf's merge raised a bare TypeError ("Cannot merge incompatible container types") for these."""
    with pytest.raises(ConfigError) as raised:
        load_config(grpo_yaml, [override])
    assert says in str(raised.value)


def test_unquoted_time_and_digit_names_reach_the_script_as_written(generate_yaml: Path, tmp_path: Path) -> None:
    text = generate_yaml.read_text().replace("trial_name: t1", "trial_name: 0123")
    path = tmp_path / "traps.yaml"
    path.write_text(text.replace("slurm: {container_type: none}", "slurm: {container_type: none, time: 1:30:00}"))
    config = load_config(path)
    assert config.trial_name == "0123" and config.launcher.slurm.time == "1:30:00"
    raise_problems(config)
    plan = plan_of(config)
    assert "--time=0-01:30:00" in plan.component_options
    saved = tmp_path / "resolved.yaml"  # the trial's config.yaml, read again by the in-job steps
    saved.write_text(to_yaml(config))
    assert load_config(saved) == config


@pytest.mark.parametrize(("text", "seconds"), [
    ("40", 2400), ("40:30", 2430), ("1:30:00", 5400), ("2-0", 172800), ("2-03:04", 183840),
    ("2-03:04:05", 183845), ("0-00:00:30", 30), ("UNLIMITED", None), ("infinite", None)])
def test_slurm_time_forms(text: str, seconds: int | None) -> None:
    assert slurm_time_seconds(text) == seconds
    if seconds is not None:
        assert slurm_time_seconds(format_slurm_time(seconds)) == seconds


@pytest.mark.parametrize("text", ["", "1h", "1:2:3:4", "1:60", "1:00:60", "2-24", "2-", "-5", "40\n", " 40",
                                  "1.5", "1:30:00\n#SBATCH --wrap=x"])
def test_not_slurm_times(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Slurm time"):
        slurm_time_seconds(text)


def test_time_limit_must_outlast_the_recover_warning(grpo_yaml: Path) -> None:
    config = load_config(grpo_yaml, ["launcher.slurm.time=5", "recover.time_limit_warning=300"])
    with pytest.raises(ConfigError, match=r"not longer than recover\.time_limit_warning"):
        raise_problems(config)
    raise_problems(load_config(grpo_yaml, ["launcher.slurm.time=5", "recover.mode=disabled"]))
    raise_problems(load_config(grpo_yaml, ["launcher.slurm.time=6"]))
