"""The experiment schema: one file per section, read by OmegaConf (torch-free)."""
