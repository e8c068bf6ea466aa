"""Moving the trainer's weights to the inference servers and proving the servers serve them: base (the transport
interface and its registry by actor.weight_update_mode), fanout (every server, the lost-server policy, the version and
fingerprint check after every push), disk (every server reloads a directory rank 0 wrote), hf_export (a version as a
Hugging Face directory, also used for checkpoints), fingerprint (logprobs of a probe, server against trainer)."""
