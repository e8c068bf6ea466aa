"""What job types rw and dpo share: preference pairs as tokens and tensors, their losses, checks and steps."""
