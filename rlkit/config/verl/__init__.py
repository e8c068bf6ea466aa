"""verl runs read by `rlkit migrate`: a run script or YAML file of verl.trainer.main_ppo becomes rlkit config."""
