"""The bytecode walk behind the op table's compiled-kernel column sees every way a kernel calls an
entry point, folds a wrapper's dead branch, and stops at another op's kernel."""

from __future__ import annotations

from pathlib import Path

import twice
from twice.portable.dispatch import entrypoints

# Planted functions of this module (within=(__name__,)).


def _by_attribute(module):
    return module.p_alpha(1)


def _by_name(get):
    return get("p_beta")


def _wrapper(function, name=None):
    def run(x):
        if name is not None and (out := x.p_gamma(name)) is not None:
            return out
        return function(x)

    return run


class _Cell:
    def step(self, module):
        return module.p_delta()


_TABLE = {"attribute": _by_attribute, "name": _by_name}
_CELLS = {"one": _Cell()}


def _by_constant_key(x):
    return _TABLE["name"](x)


def _by_any_key(kind, module):
    return _CELLS[kind].step(module)


def _importing():
    from twice.portable import native

    return native.usable()


def _found(function, **options):
    return entrypoints.reach(function, within=(__name__,), **options).entry_points


def test_the_walk_sees_attributes_names_closures_tables_and_classes():
    assert _found(_by_attribute) == {"p_alpha"} and _found(_by_name) == {"p_beta"}
    assert _found(_wrapper(_by_attribute)) == {"p_alpha"}  # name=None: that branch is dead
    assert _found(_wrapper(_by_attribute, "g")) == {"p_alpha", "p_gamma"}
    assert _found(_by_constant_key, skip=(_TABLE,)) == {"p_beta"}  # only the key looked up
    assert _found(_by_any_key) == {"p_delta"}
    setup = entrypoints.reach(_importing, within=(__name__, "twice.portable")).entry_points
    assert setup == entrypoints.setup_entry_points() and "p_threads" in setup


def test_the_walk_stops_at_another_ops_kernel_and_names_it():
    stops = {id(_by_name): "b.x"}
    found = entrypoints.reach(_by_constant_key, within=(__name__,), skip=(_TABLE,), stops=stops)
    assert found.entry_points == set() and found.via == {"b.x"}


def test_every_compiled_kernel_is_bound_by_a_c_file_and_called_from_native():
    defined = entrypoints.definitions(Path(twice.__file__).parent)
    calls = entrypoints.callers()
    assert defined["p_conv_forward"].endswith("native/csrc/conv.c")
    assert "native.conv.forward" in calls["p_conv_forward"]
    assert set(calls) <= set(defined)  # every name the Python side calls is bound in C
