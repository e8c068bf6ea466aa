"""Moving the trainer's weights to the inference servers (disk sync: rlkit.weights.disk) and proving the
servers serve them."""
