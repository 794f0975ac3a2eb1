"""core.protocol: the launcher <-> child contract round-trips exactly and rejects malformed
values."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twice.core.errors import UsageError
from twice.core.protocol import ChildSettings, parse_steps

settings = st.builds(
    ChildSettings,
    run_dir=st.none()
    | st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), min_size=1),
    seed=st.none() | st.integers(0, 2**64),
    determinism=st.none() | st.sampled_from(["strict", "warn", "off"]),
    observe=st.booleans(),
    trace=st.booleans(),
    trace_every=st.integers(1, 1000),
    params_every=st.none() | st.integers(0, 1000),
    stop_after=st.none() | st.integers(1, 10**6),
    replica_every=st.integers(1, 100),
    replica_mode=st.sampled_from(["stop", "warn"]),
)


@given(settings)
def test_settings_written_to_the_environment_read_back_equal(value):
    assert ChildSettings.from_env(value.to_env()) == value


def test_only_what_differs_from_the_defaults_is_written():
    assert ChildSettings().to_env() == {}
    assert ChildSettings(run_dir="/r", trace=False).to_env() == {
        "TWICE_RUN_DIR": "/r",
        "TWICE_TRACE": "0",
    }


def test_one_setting_reads_alone_and_unset_is_none():
    env = {"TWICE_SEED": "7", "TWICE_RUN_DIR": "/runs/a"}
    assert ChildSettings.read(env, "seed") == 7
    assert ChildSettings.read(env, "run_dir") == "/runs/a"
    assert ChildSettings.read(env, "stop_after") is None
    assert ChildSettings.read({"TWICE_PARAMS_EVERY": "auto"}, "params_every") is None


def test_a_malformed_integer_is_a_usage_error_naming_the_variable():
    with pytest.raises(UsageError, match="TWICE_STOP_AFTER='ten' is not an integer"):
        ChildSettings.from_env({"TWICE_STOP_AFTER": "ten"})


def test_the_launcher_owns_every_variable_but_the_users_own():
    owned = set(ChildSettings.variables(launcher_only=True))
    assert "TWICE_SEED" in owned and "TWICE_RUN_DIR" in owned
    users = {"TWICE_REPLICA_EVERY", "TWICE_REPLICA_MODE", "TWICE_NO_TRITON", "TWICE_NO_FUSED_RNN"}
    assert users & owned == set()
    assert set(ChildSettings.variables()) - owned == users


def test_the_users_switches_are_on_only_at_1():
    """TWICE_NO_TRITON and TWICE_NO_FUSED_RNN switch a path off only when set to 1, as before
    they were fields."""
    for name, env in (("no_triton", "TWICE_NO_TRITON"), ("no_fused_rnn", "TWICE_NO_FUSED_RNN")):
        assert ChildSettings.read({env: "1"}, name) is True
        assert not ChildSettings.read({env: "0"}, name)
        assert not ChildSettings.read({env: ""}, name)
        assert not ChildSettings.read({}, name)
        assert ChildSettings(**{name: True}).to_env() == {env: "1"}


def test_steps_parse_lists_and_ranges():
    assert parse_steps("3,10-12") == {3, 10, 11, 12}
    assert parse_steps("") == set()
