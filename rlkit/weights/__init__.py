"""Moving the trainer's weights to the inference servers and proving the servers serve them: hf_export (a version
as a Hugging Face directory, also used for checkpoints), disk (every server reloads that directory), fingerprint
(logprobs of a probe, server against trainer), server_http (the calls, with their failure kinds)."""
