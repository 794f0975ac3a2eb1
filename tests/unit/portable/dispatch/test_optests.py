"""Which test files name an op: read from real test sources planted in a folder."""

from __future__ import annotations

from twice.portable.dispatch import optests, table


def test_a_test_file_names_an_op_four_ways(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_planted.py").write_text(
        "import torch\nfrom twice.portable.dispatch.mode import PortableMode\n"
        "from twice.portable.ops import conv as pconv\n"
        "def test_it(x):\n"
        "    torch.ops.aten.mm(x, x)\n"
        "    names = ['addmm.default']\n"
        "    pconv.convolution(x)\n"
        "    with PortableMode('strict'):\n"
        "        torch.exp(x)\n"
    )
    (tmp_path / "tests" / "test_unrelated.py").write_text("import torch\ntorch.ops.aten.mm\n")
    found = optests.scan_tests(tmp_path)
    assert [f.path for f in found] == ["test_planted.py"]  # it imports twice.portable
    named = optests.naming_files
    conv = table.KERNELS["convolution.default"]
    from twice.portable.ops import conv as pconv

    assert named(found, "mm.default", [], True) == ["test_planted.py"]
    assert named(found, "mm.out", [], False) == []  # an out= form is named only by its name
    assert named(found, "addmm.default", [], False) == ["test_planted.py"]
    assert named(found, "convolution.default", [conv, pconv.convolution], False) != []
    assert named(found, "exp.default", [], True) == ["test_planted.py"]
    assert named(found, "log.default", [], True) == []
