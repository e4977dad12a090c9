import pytest

from webinfer.kernels.preprocess import PreprocessError, preprocess


def test_ifdef_else_and_defines():
    src = "#define TILE 16\n#ifdef F16\nalias t = f16;\n#else\nalias t = f32;\n#endif\nvar<workgroup> s: array<t, TILE>;\n"
    assert preprocess(src, {"F16": 1}) == "alias t = f16;\nvar<workgroup> s: array<t, 16>;\n"
    assert preprocess(src, {"TILE": 8}) == "alias t = f32;\nvar<workgroup> s: array<t, 8>;\n"


def test_if_equality_and_nesting():
    src = "#if W == 4\n#ifndef X\na\n#endif\n#else\nb\n#endif\n"
    assert preprocess(src, {"W": 4}) == "a\n"
    assert preprocess(src, {"W": 4, "X": 1}) == "\n"
    assert preprocess(src, {"W": 2}) == "b\n"


def test_whole_word_substitution_only():
    assert preprocess("let TILEX = TILE;", {"TILE": 3}) == "let TILEX = 3;\n"


def test_include_uses_same_defines():
    files = {"common.wgsl": "const N = NUM;"}
    assert preprocess('#include "common.wgsl"\nx', {"NUM": 5}, files.__getitem__) == "const N = 5;\n\nx\n"


@pytest.mark.parametrize("src", ["#endif\n", "#ifdef A\n", "#else\n", "#bogus\n", "#if A >= 1\n#endif\n"])
def test_malformed(src):
    with pytest.raises(PreprocessError):
        preprocess(src, {})
