import subprocess
import sys

import pytest

from twice.core.seeds import derive_seed


def test_derive_seed_is_the_same_in_two_separate_processes():
    code = (
        "from twice.core.seeds import derive_seed; print(derive_seed(7, 'data', 3), "
        "derive_seed(2**40, 'init'))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed), "PATH": ""},
        ).stdout
        for seed in (1, 2)
    }
    assert len(outputs) == 1
    assert outputs.pop().split() == [
        str(derive_seed(7, "data", 3)),
        str(derive_seed(2**40, "init")),
    ]


def test_derive_seed_has_pinned_values_so_it_never_changes_across_versions():
    # If this changes, every recorded run's derived streams change: treat it as a format break.
    assert derive_seed(0) == derive_seed(0)
    assert derive_seed(0, "data") == 8027297453273580733


def test_derive_seed_separates_names_purposes_and_types():
    values = {
        derive_seed(0, "data"),
        derive_seed(0, "init"),
        derive_seed(1, "data"),
        derive_seed(0, "da", "ta"),
        derive_seed(0, 1),
        derive_seed(0, "1"),
        derive_seed(0),
    }
    assert len(values) == 7
    assert all(0 <= v < 2**63 for v in values)


@pytest.mark.parametrize("bad", [1.5, None, True, object()])
def test_derive_seed_rejects_parts_that_have_no_stable_encoding(bad):
    with pytest.raises(TypeError):
        derive_seed(0, bad)


def test_a_seed_deriver_gives_exactly_derive_seeds_values():
    from twice.core.seeds import seed_deriver

    derive = seed_deriver(11, "sample", 3)
    for index in (0, 1, 255, 2**40):
        assert derive(index) == derive_seed(11, "sample", 3, index)
    assert (
        seed_deriver(0)("data") == 8027297453273580733
    )  # the pinned value, through the other path
