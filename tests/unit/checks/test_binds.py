"""Container binds at submit (rlkit.checks.binds): a bind that moves or covers a path the steps use, or whose source
does not exist, is refused with exit 2 naming the path and the fix; the paths the steps use are bound at their host
paths; nothing is written or submitted."""

from __future__ import annotations

from pathlib import Path

from rlkit.checks.binds import container_binds
from rlkit.config.load import load_config
from tests.conftest import run_rlkit


def _apptainer(tmp_path: Path) -> list[str]:
    image = tmp_path / "image.sif"
    image.write_bytes(b"SIF")
    return ["launcher.slurm.container_type=apptainer", f"launcher.slurm.inference_server_image={image}",
            f"launcher.slurm.trainer_image={image}"]


def test_binds_that_move_or_cover_a_path_or_lack_a_source_are_refused_at_once(generate_yaml: Path,
                                                                                 tmp_path: Path) -> None:
    config = load_config(generate_yaml)
    fileroot, model = config.cluster.fileroot, config.actor.path
    other = tmp_path / "other"
    other.mkdir()
    mounts = f"{tmp_path}:/data,{other}:{model},/nonexistent/src:/opt/x"
    refused = run_rlkit("submit", str(generate_yaml), *_apptainer(tmp_path), f"launcher.slurm.mount={mounts}",
                        env={"RLKIT_HOME": str(tmp_path / "home")})
    assert refused.returncode == 2, refused.stderr
    err = " ".join(refused.stderr.split())
    assert f"moves cluster.fileroot ({fileroot}) to /data/fileroot inside the container" in err
    assert f"fix: bind it at the same path ({tmp_path}:{tmp_path})" in err
    assert f"'{other}:{model}' lays {other} over actor.path ({model})" in err
    assert "the source of '/nonexistent/src:/opt/x' does not exist here" in err
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "fileroot").exists() and not (tmp_path / "home").exists(), "nothing written"


def test_an_identity_bind_above_a_path_is_enough(generate_yaml: Path, tmp_path: Path) -> None:
    config = load_config(generate_yaml, [*_apptainer(tmp_path), f"launcher.slurm.mount={tmp_path}:{tmp_path}:ro"])
    user, added = container_binds(config)
    assert [b.text() for b in user] == [f"{tmp_path}:{tmp_path}:ro"] and added == [], "all under the user's bind"
    rendered = run_rlkit("render", str(generate_yaml), *_apptainer(tmp_path),
                         f"launcher.slurm.mount={tmp_path}:{tmp_path}:ro")
    assert rendered.returncode == 0, rendered.stderr


def test_added_binds_come_in_the_same_order_in_every_process(generate_yaml: Path, tmp_path: Path) -> None:
    """Two host paths of equal length (the model and a second model) are bound in one order whatever the process's
    string hashing: the rendered script must not change from one `rlkit render` to the next."""
    import os
    import subprocess
    import sys

    for name in ("model-b", "model-a"):
        (tmp_path / name).mkdir()
    overrides = [*_apptainer(tmp_path), f"actor.path={tmp_path / 'model-b'}", f"tokenizer_path={tmp_path / 'model-a'}"]
    script = ("import sys; from rlkit.checks.binds import container_binds; from rlkit.config.load import load_config; "
              "print([b.text() for b in container_binds(load_config(sys.argv[1], sys.argv[2:]))[1]])")
    orders = {subprocess.run([sys.executable, "-c", script, str(generate_yaml), *overrides], check=True, text=True,
                             capture_output=True, env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout
              for seed in range(6)}
    assert len(orders) == 1, orders
    listed = orders.pop()
    assert listed.index(str(tmp_path / "model-a")) < listed.index(str(tmp_path / "model-b")), listed
