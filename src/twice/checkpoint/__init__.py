"""Complete, verified, pickle-free checkpoints: `twice.checkpoint.save(dir, **state)` and `load`.

twice.checkpoint.save("ckpt/step-100", model=model, optimizer=optimizer)
twice.checkpoint.load("ckpt/step-100", model=model, optimizer=optimizer)
"""

from twice.checkpoint.codec import decode_state, encode_state
from twice.checkpoint.folder import RNG_ENTRY
from twice.checkpoint.saveload import latest, list_checkpoints, load, save, step_dir
from twice.checkpoint.saveload import verify_loadable as verify
from twice.core.errors import CheckpointError

__all__ = [
    "save",
    "load",
    "verify",
    "latest",
    "list_checkpoints",
    "step_dir",
    "CheckpointError",
    "RNG_ENTRY",
    "encode_state",
    "decode_state",
]
