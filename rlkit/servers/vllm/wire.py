"""The wire format of a weight broadcast that the trainer (rlkit.weights.xccl) and the workers
(rlkit.servers.vllm.gloo_engine, vLLM's NCCL engine) must agree on. Pure Python: both sides import it.
"""

from __future__ import annotations

from collections.abc import Sequence

# The byte size of one packed chunk: vLLM's default (`DEFAULT_PACKED_BUFFER_SIZE_BYTES`), so a bucket of up to 1 GiB
# travels as one flat buffer (one collective). The trainer (rlkit.weights.xccl) cuts chunks with the same value.
PACKED_BUFFER_BYTES = 1024**3
PACKED_NUM_BUFFERS = 2  # vLLM's default; the NCCL consumer double-buffers on the GPU, gloo ignores it
# The relay (gloo, rlkit.servers.vllm.relay) forwards each tensor in pieces of at most this many bytes, so the next
# server receives a piece while this one still receives the rest: the chain's delay is a few pieces, not a tensor.
RELAY_PIECE_BYTES = 4 << 20


def packed_chunks(sizes: Sequence[int], buffer_bytes: int) -> list[range]:
    """Indices of the tensors of each packed chunk, given their byte sizes in send order.

    vLLM's rule (`packed_nccl_broadcast_consumer`): add tensors to a chunk until its size EXCEEDS `buffer_bytes`; the
    tensor that crosses the limit is still in the chunk. Sender and receivers must cut at the same places.
    """
    chunks: list[range] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        total += size
        if total > buffer_bytes:
            chunks.append(range(start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        chunks.append(range(start, len(sizes)))
    return chunks


def default_packed(backend: str) -> bool:
    """Whether a bucket travels as flat byte chunks (one collective per chunk) or tensor by tensor.

    NCCL (GPUs): packed, vLLM's own default: the copy into the chunk runs at device-memory speed and saves a
    collective launch per tensor. gloo (CPU): per tensor, every broadcast issued at once without waiting (both
    sides; gloo matches them by issue order): packing costs a full memory copy of the bucket on the trainer's CPU
    (0.9 s for 440 MB, measured by bench/bench_xccl.py), more than the whole raw broadcast of those bytes.
    """
    return backend != "gloo"


def relay_pieces(nbytes: int, piece_bytes: int = RELAY_PIECE_BYTES) -> list[tuple[int, int]]:
    """The (start, end) byte ranges a buffer of `nbytes` travels in along a relay; sender and relays cut alike."""
    return [(start, min(start + piece_bytes, nbytes)) for start in range(0, nbytes, piece_bytes)]


def default_relay(backend: str) -> bool:
    """Whether the group is a chain (each rank forwards to the next: rank 0 sends one copy whatever the number of
    servers) or vLLM's native broadcast. gloo: a chain, since gloo's broadcast is a binomial tree whose root sends
    ceil(log2(world)) copies (measured: 3 copies at a world of 5). NCCL: its own broadcast, which is pipelined
    along a ring already (the root sends about one copy) and which vLLM's NCCL engine expects."""
    return backend == "gloo"
