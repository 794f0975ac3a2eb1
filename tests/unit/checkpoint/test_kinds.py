"""One table of checkpoint entry kinds: every kind round-trips, a name outside it is refused."""

import numpy as np
import torch

from twice import checkpoint
from unit.checkpoint.test_saveload import Model, trained


def test_every_kind_in_the_table_round_trips_through_save_and_load(tmp_path):
    from twice.checkpoint.kinds import KINDS, kind_of

    model, opt, _ = trained()
    generator = torch.Generator().manual_seed(3)
    rng = np.random.default_rng(4)
    objects = {"model": model, "generator": generator, "rng": rng, "value": {"epoch": 2}}
    assert {kind_of(obj).name for obj in objects.values()} | {"sharded_optimizer"} == {
        kind.name for kind in KINDS
    }
    path = checkpoint.save(tmp_path / "step-00000002", **objects)
    expected_torch, expected_np = torch.rand(4, generator=generator), rng.random(4)
    fresh, new_generator, new_rng = (
        Model(),
        torch.Generator().manual_seed(9),
        np.random.default_rng(9),
    )
    restored = checkpoint.load(path, model=fresh, generator=new_generator, rng=new_rng)
    assert restored["value"] == {"epoch": 2}
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values())
    )
    assert torch.equal(torch.rand(4, generator=new_generator), expected_torch)
    assert np.array_equal(new_rng.random(4), expected_np)


def test_a_kind_name_outside_the_table_is_a_checkpoint_error_naming_the_entry():
    import pytest

    from twice.checkpoint.kinds import KINDS, kind_named
    from twice.core.errors import CheckpointError

    assert all(kind_named(kind.name, "e", "c") is kind for kind in KINDS)
    for name in ("statefum", "", None, 3, ["stateful"]):
        with pytest.raises(CheckpointError, match="records entry 'model' as"):
            kind_named(name, "model", "step-00000001")
