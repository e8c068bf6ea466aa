"""The torch dtypes that the config's dtype names (actor.dtype, ref.dtype, critic.dtype) stand for: one table for the
trainer's models and the weights it writes or sends to the servers (submit-time checks list the names torch-free)."""

from __future__ import annotations

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
