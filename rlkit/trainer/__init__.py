"""Pure tensor pieces of the trainer: reward shaping, advantages and policy losses."""
