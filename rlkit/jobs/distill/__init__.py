"""Job type distill: on-policy distillation from a teacher served as an auxiliary model."""
