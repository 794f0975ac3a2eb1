"""Distributed Checkpoint's `.metadata`, read without running code: the digest of the state it
describes, the same for two saves of one state, and a crafted file refused."""

import pickle
from pathlib import Path

import pytest
import torch

from twice.core.errors import CorruptRecord
from twice.store import dcpmeta
from twice.store.outputs import compare_outputs, written_files


def _dcp_save(state, folder):
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)


def test_dcp_metadata_of_the_same_state_differs_only_in_the_save(tmp_path):
    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}
    _dcp_save(state, tmp_path / "one")
    _dcp_save(state, tmp_path / "two")
    _dcp_save({"w": torch.arange(8.0).reshape(2, 4), "b": torch.ones(3)}, tmp_path / "wider")
    first, second, wider = (tmp_path / n / ".metadata" for n in ("one", "two", "wider"))
    assert first.read_bytes() != second.read_bytes()  # DCP's random save id, its folder
    assert dcpmeta.state_digest(first) == dcpmeta.state_digest(second) is not None
    assert dcpmeta.state_digest(first) != dcpmeta.state_digest(wider)
    listing = {
        name: written_files(tmp_path / name, 0, [])[".metadata"] for name in ("one", "two", "wider")
    }
    assert compare_outputs({"m": listing["one"]}, {"m": listing["two"]})["dcp_save_id"] == ["m"]
    assert compare_outputs({"m": listing["one"]}, {"m": listing["wider"]})["differ"] == ["m"]


@pytest.mark.parametrize(
    "payload",
    [
        b"cos\nsystem\n(S'true'\ntR.",  # a call of os.system
        pickle.dumps({"state_dict_metadata": {}}),  # not DCP's record
        b"\x80\x04not a pickle",
        pickle.dumps(Path("x")),  # an allowed class, but not the record
    ],
)
def test_dcp_metadata_is_read_without_running_code(tmp_path, payload):
    with pytest.raises(CorruptRecord):
        dcpmeta.read(payload, "crafted/.metadata")
    target = tmp_path / ".metadata"
    target.write_bytes(payload)
    (tmp_path / "__0_0.distcp").write_bytes(b"")
    assert dcpmeta.is_dcp_metadata(target) and dcpmeta.state_digest(target) is None
