"""`rlkit migrate run.sh` expands the shell variables the script itself assigns before its verl command
(rlkit.config.verl.variables, rlkit.config.verl.shell): verl's examples write `kl_coef=0.0` ...
`algorithm.kl_ctrl.kl_coef=$kl_coef`, and every `$var` stayed literal, so the value was refused ("'$kl_coef' not a
number") or kept as a path. The script is read, never run: the words are checked against bash's own for the same
lines, and a hostile `$(...)` is shown never to run."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from rlkit.config.verl.shell import arithmetic
from rlkit.config.verl.source import read_script, typed
from tests.conftest import run_rlkit
from tests.unit.config.test_verl_learning import _script
from tests.unit.config.test_verl_migrate import _migrated

COMMAND = "PYTHONUNBUFFERED=1 /opt/conda/bin/python3 -m verl.trainer.main_ppo"


def _run(assignments: str, *lines: str) -> str:
    """verl's GRPO example script with `assignments` before its command and `lines` (key=value) in it."""
    return _script(*lines).replace(COMMAND, assignments.strip("\n") + "\n" + COMMAND)


def _leaves(assignments: str, *lines: str) -> dict[str, object]:
    return read_script(_run(assignments, *lines), "t").leaves


def test_each_assignment_form_and_quoting() -> None:
    leaves = _leaves("adv=grpo\nexport kl='0.0'\nlr=\"3e-6\"\nname=qwen\nproj='my project'",
                     "algorithm.adv_estimator=${adv}", "algorithm.kl_ctrl.kl_coef=$kl",
                     "actor_rollout_ref.actor.optim.lr=\"$lr\"", "trainer.experiment_name=${name}_run2",
                     "trainer.project_name=\"$proj\"", "trainer.default_local_dir='/ckpt/$name'")
    assert leaves["algorithm.adv_estimator"] == "grpo" and leaves["algorithm.kl_ctrl.kl_coef"] == 0.0
    assert leaves["actor_rollout_ref.actor.optim.lr"] == 3e-6  # typed after expansion, as Hydra types it
    assert leaves["trainer.experiment_name"] == "qwen_run2"  # ${x}suffix
    assert leaves["trainer.project_name"] == "my project"  # double quotes: one word
    assert leaves["trainer.default_local_dir"] == "/ckpt/$name"  # single quotes: not expanded


def test_a_reference_chain_and_the_value_at_the_command() -> None:
    """Each assignment sees the values before it; a later one wins; one after the command changes nothing."""
    script = _run("base=/data\nsub=$base/gsm8k\nfiles=\"['$sub/train.parquet']\"\nn=4\nn=8",
                  "data.train_files=\"$files\"", "actor_rollout_ref.rollout.n=$n")
    leaves = read_script(script + "n=16\n", "t").leaves
    assert leaves["data.train_files"] == ["/data/gsm8k/train.parquet"] and leaves["actor_rollout_ref.rollout.n"] == 8


def test_an_unquoted_value_splits_into_words_as_bash_splits_it() -> None:
    """verl's gspo/sapo scripts hold several key=value words in one multi-line string and expand it unquoted."""
    leaves = _leaves('TP=2\nEXTRA="\n    trainer.save_freq=7 \\\n    trainer.test_freq=$TP"\nnothing=',
                     "$EXTRA", "$nothing", "actor_rollout_ref.rollout.tensor_model_parallel_size=$TP")
    assert (leaves["trainer.save_freq"], leaves["trainer.test_freq"]) == (7, 2)
    assert leaves["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2


def test_the_default_form_takes_the_default_and_the_header_says_the_environment_would_win(
        tmp_path: Path, site: list[str]) -> None:
    script = tmp_path / "run.sh"
    script.write_text(_run("NNODES=${NNODES:-2}\nGPUS=${GPUS-8}\nENGINE=${1:-vllm}\nset_here=4\n"
                           "kept=${set_here:-99}", "trainer.nnodes=$NNODES", "trainer.n_gpus_per_node=${GPUS}",
                           "actor_rollout_ref.rollout.name=$ENGINE", "actor_rollout_ref.rollout.n=$kept"))
    text = _migrated(script, site)
    lines = script.read_text().splitlines()
    line = {name: 1 + next(i for i, s in enumerate(lines) if s.startswith(f"{name}=")) for name in
            ("NNODES", "GPUS", "ENGINE", "kept")}
    assert f"#   $NNODES = 2 (line {line['NNODES']}; ${{NNODES:-...}}'s default: NNODES set in verl's environment " \
           "would win)\n" in text
    assert f"#   $GPUS = 8 (line {line['GPUS']}; ${{GPUS:-...}}'s default" in text
    assert f"#   $ENGINE = vllm (line {line['ENGINE']}; ${{1:-...}}'s default: an argument 1 given to the script " \
           "would win)\n" in text
    assert f"#   $kept = 4 (line {line['kept']})\n" in text  # the script's own value: no default taken
    leaves = read_script(script.read_text(), "t").leaves
    assert (leaves["trainer.nnodes"], leaves["trainer.n_gpus_per_node"]) == (2, 8)


@pytest.mark.parametrize(("expression", "value"), [
    ("1024 * 8", 8192), ("(a + b) * 3", 30), ("a+b*3", 26), ("-7 / 2", -3), ("7 % -3", 1), ("-7 % 3", -1),
    ("$a - ${b}", -6), ("((a))", 2), ("- -a", 2)])
def test_arithmetic_is_bash_s(expression: str, value: int) -> None:
    assert arithmetic(expression, {"a": 2, "b": 8}.get) == value


@pytest.mark.parametrize("expression", ["7 // 2", "2 ** 3", "1 / 0", "x + 1", "010 + 1", "$(echo 1) + 1",
                                        "9223372036854775807 + 1", "1 +", "(1", "a ? 1 : 2", "9" * 40])
def test_arithmetic_bash_would_refuse_or_rlkit_does_not_follow_is_not_computed(expression: str) -> None:
    assert arithmetic(expression, {"a": 2}.get) is None


def test_arithmetic_in_assignments_and_in_the_command() -> None:
    leaves = _leaves("max_prompt_length=$((1024 * 2))\nmax_response_length=$((1024 * 8))\n"
                     "tokens=$(((max_prompt_length + max_response_length) * 3))",
                     "data.max_response_length=${max_response_length}",
                     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$tokens",
                     "actor_rollout_ref.rollout.max_num_batched_tokens=$((max_prompt_length + max_response_length))")
    assert leaves["data.max_response_length"] == 8192
    assert leaves["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 30720
    assert leaves["actor_rollout_ref.rollout.max_num_batched_tokens"] == 10240


def test_what_rlkit_does_not_follow_stays_as_written() -> None:
    """A command substitution, `${#x}`, an array appended to, a variable set in an if, a loop or a function, after a
    `source`, and the environment's ($HOME): each left unexpanded, named in the header as before."""
    run = read_script(_run("now=$(date +%s)\nstamp=`date`\nlong=abc\nlen=${#long}\narr=(a b)\narr+=(c)\n"
                           "if [ -n \"$X\" ]; then\n  kl=0.1\nfi\nfor lr in 1 2; do :; done\n"
                           "f() {\n  n=3\n}\n[ -f x ] && tp=2\nhome=$HOME/data",
                           "trainer.experiment_name=run_$now", "trainer.project_name=$stamp",
                           "trainer.save_freq=$len", "trainer.test_freq=$arr", "algorithm.kl_ctrl.kl_coef=$kl",
                           "actor_rollout_ref.actor.optim.lr=$lr", "actor_rollout_ref.rollout.n=$n",
                           "actor_rollout_ref.rollout.tensor_model_parallel_size=$tp", "data.train_files=$home"),
                       "t")
    assert run.leaves["trainer.experiment_name"] == "run_$now" and run.leaves["trainer.project_name"] == "$stamp"
    assert run.leaves["algorithm.kl_ctrl.kl_coef"] == "$kl" and run.leaves["actor_rollout_ref.rollout.n"] == "$n"
    assert run.leaves["actor_rollout_ref.actor.optim.lr"] == "$lr" and run.leaves["trainer.test_freq"] == "$arr"
    assert run.leaves["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "$tp"
    assert run.leaves["trainer.save_freq"] == "$len"
    assert run.leaves["data.train_files"] == "$HOME/data" and run.variables["data.train_files"] == ["HOME"]
    assert run.assigned["now"] == "$(date +%s)" and {e.name for e in run.expanded} == {"home", "MODEL"}
    sourced = read_script(_run("kl=0.1\nsource ./env.sh", "algorithm.kl_ctrl.kl_coef=$kl"), "t")
    assert sourced.leaves["algorithm.kl_ctrl.kl_coef"] == "$kl"  # env.sh could set it again


def test_a_hostile_script_runs_nothing(tmp_path: Path) -> None:
    """Substitutions in assignments, defaults, arithmetic and the command are never run; a value doubled past any
    size stays unexpanded, quickly."""
    canary = tmp_path / "canary"
    canary.write_text("still here")
    pwned = tmp_path / "pwned"
    script = _run(f"x=$(rm -rf {canary})\ny=`touch {pwned}`\nz=${{UNSET:-$(touch {pwned})}}\n"
                  f"w=$(( $(touch {pwned}) + 1 ))\nbig=aaaaaaaa\n" + "big=$big$big\n" * 40,
                  "trainer.experiment_name=$x", "trainer.project_name=$y", "trainer.save_freq=$z",
                  "trainer.test_freq=$w", "trainer.default_local_dir=$big", f"data.train_files=$(touch {pwned})")
    start = time.monotonic()
    run = read_script(script, "t")
    assert time.monotonic() - start < 2
    assert canary.read_text() == "still here" and not pwned.exists()
    assert (run.leaves["trainer.experiment_name"], run.leaves["trainer.project_name"]) == ("$x", "$y")
    assert (run.leaves["trainer.save_freq"], run.leaves["trainer.test_freq"]) == ("$z", "$w")
    assert run.leaves["trainer.default_local_dir"] == "$big" and run.assigned["x"] == f"$(rm -rf {canary})"


ORACLE = r"""adv=grpo
export kl='0.0'
n=4
n=$((n * 2 + 1))
base=/data
files="['$base/a.parquet', '$base/b.parquet']"
NNODES=${NNODES:-3}
EMPTY=
D=${EMPTY:-dflt}
E=${EMPTY-kept}
quote="it's \"q\" \$x"
EXTRA="
    trainer.save_freq=7 \
    trainer.test_freq=$n"
printf '%s\0' verl.trainer.main_ppo a.adv=${adv} a.kl=$kl a.n=$n a.files="$files" a.nodes=$NNODES \
    a.d=$D a.e="$E" a.q="$quote" a.s='$adv' a.t="${adv}_x" a.u=$((NNODES*n)) $EXTRA a.split=$files
"""


def test_the_words_are_bash_s_own(tmp_path: Path) -> None:
    """The same lines run by bash itself (printf the words; nothing else, no environment) give the words rlkit
    reads: each value, and the unquoted list's split into two words (the second not key=value)."""
    script = tmp_path / "oracle.sh"
    script.write_text(ORACLE)
    done = subprocess.run(["bash", "--norc", "--noprofile", str(script)], capture_output=True, check=True,
                          env={"PATH": os.environ["PATH"]}, cwd=tmp_path)
    words = done.stdout.decode().split("\0")[1:-1]
    expected = {w.split("=", 1)[0]: typed(w.split("=", 1)[1]) for w in words if "=" in w}
    run = read_script(ORACLE, "t")
    assert run.leaves == expected, (run.leaves, expected)
    assert run.ignored == [w for w in words if "=" not in w] == ["'/data/b.parquet']"]
    assert len(expected) == 14 and expected["a.split"] == "['/data/a.parquet',"


def test_migrate_of_a_script_of_variables_exits_0_saying_each(tmp_path: Path, site: list[str]) -> None:
    """The form verl's DAPO-style examples take: every value a variable (each was refused before)."""
    script = tmp_path / "run.sh"
    script.write_text(_run("adv_estimator=grpo\nkl_coef=0.0\nuse_kl_in_reward=False\nn_resp=8",
                           "algorithm.adv_estimator=${adv_estimator}", "algorithm.kl_ctrl.kl_coef=$kl_coef",
                           "algorithm.use_kl_in_reward=${use_kl_in_reward}", "actor_rollout_ref.rollout.n=${n_resp}")
                      .replace("    algorithm.adv_estimator=grpo \\\n", ""))
    done = run_rlkit("migrate", str(script), *site)
    assert done.returncode == 0, done.stderr
    assert "#   $adv_estimator = grpo (line 7)\n" in done.stdout and "#   $kl_coef = 0.0 (line 8)\n" in done.stdout
    assert "n_samples: 8" in done.stdout


ARRAYS = r"""n=4
base=/data
DATA=(
    data.train_files="['$base/a.parquet']"
    # a comment inside, with a quote: don't
    data.n=$n   # a trailing comment
# unindented
    'data.q=it s'
    +data.x=${n}_y
    trainer.logger='["console","wandb"]'
    data.later=${set_later}
)
set_later=9
EMPTY=()
ONE=(solo)
printf '%s\0' verl.trainer.main_ppo "${DATA[@]}" a.first=$DATA a.star="${ONE[*]}" ${ONE[@]} "${EMPTY[@]}" \
    a.after="${ONE[@]}"
"""


def test_an_array_s_words_are_bash_s_own(tmp_path: Path) -> None:
    """verl's megatron-LoRA and NPU examples list their keys one a line in arrays (`DATA=( ... )`) and pass
    "${DATA[@]}": each key was dropped unread, and the run migrated as verl's defaults. The same lines run by bash
    give the words rlkit reads, but for the one word whose variable the array names before the script sets it (bash's
    empty value; rlkit keeps it as written, named for the header, as it keeps any variable it cannot know)."""
    script = tmp_path / "arrays.sh"
    script.write_text(ARRAYS)
    done = subprocess.run(["bash", "--norc", "--noprofile", str(script)], capture_output=True, check=True,
                          env={"PATH": os.environ["PATH"]}, cwd=tmp_path)
    words = done.stdout.decode().split("\0")[1:-1]
    expected = {w.split("=", 1)[0].lstrip("+"): typed(w.split("=", 1)[1]) for w in words if "=" in w}
    run = read_script(ARRAYS, "t")
    assert expected.pop("data.later") == "" and run.leaves.pop("data.later") == "$set_later"
    assert run.variables == {"data.later": ["set_later"]}
    assert run.leaves == expected, (run.leaves, expected)
    assert run.ignored == [w for w in words if "=" not in w] == ["solo"]  # "${EMPTY[@]}": no word at all
    assert expected["data.train_files"] == ["/data/a.parquet"] and expected["data.x"] == "4_y"


def test_a_script_of_arrays_migrates_with_its_keys(tmp_path: Path, site: list[str]) -> None:
    """The form of verl's run_qwen2-7b_math_megatron_lora.sh: its trainer.test_freq reaches evaluator.freq_steps
    (before: nothing read, so valid_dataset.path with no evaluator, refused)."""
    lines = _script().splitlines()
    at = next(i for i, line in enumerate(lines) if "verl.trainer.main_ppo" in line)
    keys = [line.split()[0] for line in lines[at + 1:] if line.startswith("    ")]  # the last's "$@" | tee: not
    keys = [key for key in keys if not key.startswith(("trainer.test_freq", "trainer.val_before_train"))]
    arrays = "ALL=(\n" + "".join(f"    {key}\n" for key in keys) + ")\nTRAINER=(\n    trainer.test_freq=5\n" \
             "    trainer.val_before_train=False\n)\n"
    script = tmp_path / "run.sh"
    script.write_text("\n".join(lines[:at]) + "\n" + arrays + lines[at].rstrip("\\") + '"${ALL[@]}" '
                      '"${TRAINER[@]}" "$@"\n')
    done = run_rlkit("migrate", str(script), *site)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert config["evaluator"]["freq_steps"] == 5 and config["evaluator"]["eval_on_startup"] is False
    assert config["gconfig"]["n_samples"] == 5 and config["actor"]["kl_loss_coef"] == 0.001  # not verl's defaults


def test_a_variable_word_rlkit_cannot_expand_is_refused_not_dropped(tmp_path: Path, site: list[str]) -> None:
    """verl's run_qwen30b_gspo.sh sets ACTOR_CONFIG (its actor's keys) inside an if and passes $ACTOR_CONFIG: the
    word was dropped and the run migrated with verl's defaults for every key it held. Now each such word is named,
    with or without other problems; the script's own arguments ("$@", "${@:2}") are still dropped."""
    script = tmp_path / "run.sh"
    script.write_text(_run('if [ -n "$X" ]; then\n  EXTRA="trainer.save_freq=7"\nfi\nARR=(a)\nARR+=(b)',
                           "$EXTRA", '"${ARR[@]}"', "$FROM_ENV", '"${@:2}"'))
    done = run_rlkit("migrate", str(script), *site)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "words $EXTRA, ${ARR[@]} (set where rlkit does not follow" in done.stderr
    assert "; $FROM_ENV (never set by the script: the environment's)" in done.stderr and "${@:2}" not in done.stderr
    script.write_text(script.read_text().replace("rollout.name=vllm", "rollout.name=trtllm"))
    both = run_rlkit("migrate", str(script), *site)
    assert both.returncode == 2 and "$FROM_ENV" in both.stderr and "rollout.name 'trtllm'" in both.stderr
