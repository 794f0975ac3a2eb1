"""arithmetic/philox: the counter-based generator gives Random123's published answers, and
streams that look random and follow torch's generator."""

import torch

from twice.portable.arithmetic import philox


def test_philox_known_answers():
    # Random123's kat_vectors for philox4x32_10
    cases = [
        ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
        ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
        (
            [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
            [0xA4093822, 0x299F31D0],
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
        ),
    ]
    for counter, key, expected in cases:
        words = philox.philox_words([torch.tensor([c]) for c in counter], key[0] | key[1] << 32)
        assert [int(w) for w in words] == expected


def test_random_streams_look_random_and_follow_the_generator():
    n = philox.normal(200_000, 7)
    u = philox.uniform(200_000, 8)
    assert abs(float(n.mean())) < 0.01 and abs(float(n.std()) - 1) < 0.01
    assert float(u.min()) >= 0 and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01
    assert sorted(philox.randperm(100, 3).tolist()) == list(range(100))
    torch.manual_seed(5)
    first = philox.draw_key()
    torch.manual_seed(5)
    assert philox.draw_key() == first  # keyed from torch's generator: manual_seed replays it
    assert philox.draw_key() != first
