"""This machine's determinism hazards: each named with how to deal with it, and gone once dealt
with."""

import os

import torch

from twice.runtime.hazards import Hazard, machine_hazards


def _names():
    return {hazard.name for hazard in machine_hazards()[0]}


def test_what_is_left_unset_is_a_hazard_and_what_is_set_is_not(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    torch.use_deterministic_algorithms(False)
    assert {"threads", "deterministic algorithms"} <= _names()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.use_deterministic_algorithms(True)
    assert not {"threads", "deterministic algorithms"} & _names()


def test_every_hazard_says_how_to_deal_with_it_and_the_facts_come_with_them(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    hazards, facts = machine_hazards()
    assert all(isinstance(h, Hazard) and h.detail and h.fix for h in hazards)
    assert all(set(h.to_json()) == {"name", "detail", "fix"} for h in hazards)
    assert facts["env"]["OMP_NUM_THREADS"] == "3" and facts["python"]["version"]
    assert os.environ["OMP_NUM_THREADS"] == "3"
