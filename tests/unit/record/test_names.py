"""record/names: each parameter named by its path from the outermost module that holds it,
distinct across modules and optimizers, and kept per live optimizer."""

import pytest
import torch

from twice.record.names import (
    ParamNames,
    distinct_names,
    names_in_words,
    param_names,
    process_stream,
)
from unit.record.loops import train


def test_a_parameter_is_named_by_its_path_from_the_outermost_module():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    names, roots = param_names(optimizer)
    assert [names[id(p)] for p in model.parameters()] == [
        "0.weight",
        "0.bias",
        "1.0.weight",
        "1.0.bias",
    ]
    assert {roots[id(p)] for p in model.parameters()} == {(id(model), "Sequential")}


def test_names_that_coincide_across_outermost_modules_get_their_class():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    embedding = torch.nn.Embedding(3, 2)
    optimizer = torch.optim.SGD([*a.parameters(), *b.parameters(), embedding.weight], lr=0.1)
    pairs = ParamNames().of(optimizer)
    assert [name for name, _ in pairs] == [
        "Linear.weight",
        "Linear.bias",
        "Linear#2.weight",
        "Linear#2.bias",
        "Embedding.weight",
    ]
    assert [p for _, p in pairs] == list(optimizer.param_groups[0]["params"])
    # against the names another optimizer took already
    names = {1: "weight", 2: "bias"}
    roots = {1: (10, "Linear"), 2: (10, "Linear")}
    assert distinct_names(names, roots, [1, 2], {"weight"}) == {
        1: "Linear.weight",
        2: "Linear.bias",
    }


def test_two_optimizers_of_one_process_get_distinct_names():
    generator, critic = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    first = torch.optim.SGD(critic.parameters(), lr=0.1)
    second = torch.optim.SGD(generator.parameters(), lr=0.1)
    names = ParamNames()
    assert [n for n, _ in names.of(first)] == ["weight", "bias"]
    assert [n for n, _ in names.of(second)] == ["Linear.weight", "Linear.bias"]
    assert [n for n, _ in names.all()] == ["weight", "bias", "Linear.weight", "Linear.bias"]
    loose = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)  # in no module
    assert [n for n, _ in names.of(loose)] == ["optimizer2.group0.param0"]


@pytest.mark.slow
def test_a_new_optimizer_at_a_freed_ones_address_is_named_with_its_own_parameters():
    names, seen, reused = ParamNames(), set(), 0
    for _ in range(200):
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        reused += id(optimizer) in seen
        seen.add(id(optimizer))
        pairs = names.of(optimizer)
        assert [name for name, _ in pairs] == ["weight", "bias"]
        assert all(p is q for (_, p), q in zip(pairs, [model.weight, model.bias], strict=True))
        del model, optimizer, pairs
    assert reused, "CPython reused no optimizer's address: the case was not exercised"
    assert names.all() == []  # every optimizer was freed, and with it what it named


def test_names_in_words_lists_six_at_most():
    assert names_in_words(["w"]) == "`w`"
    assert names_in_words(["a", "b", "c"]) == "`a`, `b` and `c`"
    assert names_in_words([str(i) for i in range(8)]) == ("`0`, `1`, `2`, `3`, `4`, `5` and 2 more")


def test_the_main_process_keeps_its_stream():
    assert process_stream("rank1") == "rank1" and process_stream(None) is None


def test_parameters_named_alike_in_separate_modules_get_distinct_names(tmp_path):
    """Two top-level modules both have a "weight": within one optimizer, and across a GAN's two."""

    def one_optimizer():
        a, b, c = (
            torch.nn.Linear(3, 3),
            torch.nn.Linear(3, 1),
            torch.nn.Sequential(torch.nn.Linear(3, 3)),
        )
        optimizer = torch.optim.SGD([*a.parameters(), *b.parameters(), *c.parameters()], lr=0.1)
        return [a, b, c], [optimizer], lambda step: b(a(c(torch.randn(4, 3)))).sum()

    records = train(tmp_path, one_optimizer, name="one")
    assert list(records[0].param_digests) == sorted(
        ["Linear.weight", "Linear.bias", "Linear#2.weight", "Linear#2.bias", "0.weight", "0.bias"]
    )

    def gan():
        d, g = torch.nn.Linear(2, 1), torch.nn.Linear(2, 2)
        optimizers = [
            torch.optim.SGD(d.parameters(), lr=0.1),
            torch.optim.SGD(g.parameters(), lr=0.1),
        ]
        return [d, g], optimizers, lambda step: d(g(torch.randn(4, 2))).mean()

    records = train(tmp_path, gan, name="gan")
    assert len(records[0].param_digests) == len(records[0].grad_digests) == 4
    assert set(records[0].param_digests) == {"weight", "bias", "Linear.weight", "Linear.bias"}
