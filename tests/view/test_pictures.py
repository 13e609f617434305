"""nbdist.view.pictures: a tensor drawn as a grid coloured by owning rank, static HTML that survives the sanitiser."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

import nbdist
from nbdist.view.pictures import NEUTRAL, PALETTE, Picture, picture, show, text_colour
from nbdist.view.sanitize import STYLE_PROPERTIES, clean_html

picture_module = sys.modules[picture.__module__]

RANK0, RANK1, RANK2, RANK3 = PALETTE[:4]


class _Tags(HTMLParser):
    """Every (tag, attributes) in a piece of HTML, and the text of each td."""

    def __init__(self, markup: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.cells: list[tuple[str, dict[str, str | None]]] = []
        self._in_td: dict[str, str | None] | None = None
        self.feed(markup)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "td":
            self._in_td = dict(attrs)

    def handle_data(self, data: str) -> None:
        if self._in_td is not None:
            self.cells.append((data, self._in_td))
            self._in_td = None


def cells(p: Picture) -> list[tuple[str, str | None]]:
    """(text, background colour or None for neutral) of each value cell, in row-major order."""
    out = []
    for text, attrs in _Tags(p.html).cells:
        background = re.search(r"background-color:([^;]+)", attrs["style"] or "").group(1)
        out.append((text, None if background == NEUTRAL else background))
    return out


def contrast(a: str, b: str) -> float:
    def luminance(colour: str) -> float:
        rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_convention_colours_a_1d_tensor_by_value_div_100():
    p = picture(torch.tensor([0, 1, 100, 101]), world_size=2)
    assert cells(p) == [("0", RANK0), ("1", RANK0), ("100", RANK1), ("101", RANK1)]
    assert 'title="rank 0"' in p.html and 'title="rank 1"' in p.html


def test_convention_colours_a_2d_tensor_row_by_row():
    p = picture(torch.tensor([[0, 1, 100, 101], [200, 201, 300, 301]]), world_size=4)
    assert [c for _, c in cells(p)] == [RANK0, RANK0, RANK1, RANK1, RANK2, RANK2, RANK3, RANK3]
    assert p.html.count("<tr>") == 2


def test_convention_leaves_values_outside_the_world_neutral():
    p = picture(torch.tensor([0, 150, 250, -1]), world_size=2)
    assert cells(p) == [("0", RANK0), ("150", RANK1), ("250", None), ("-1", None)]


def test_convention_leaves_fractions_nan_and_bools_neutral():
    assert [c for _, c in cells(picture([0.5, 100.0, float("nan"), -0.0], world_size=2))] == [None, RANK1, None, RANK0]
    assert [c for _, c in cells(picture(torch.tensor([True, False])))] == [None, None]


def test_convention_without_a_world_colours_up_to_eight_ranks():
    assert [c for _, c in cells(picture([799, 800]))] == [PALETTE[7], None]


def test_convention_uses_the_joined_worlds_size(monkeypatch):
    world = types.SimpleNamespace(world_size=2)
    magics = types.SimpleNamespace(session=types.SimpleNamespace(world=world))
    fake = types.SimpleNamespace(DistMagics=type("DistMagics", (), {}))
    shell = types.SimpleNamespace(magics_manager=types.SimpleNamespace(registry={"DistMagics": magics}))
    monkeypatch.setitem(sys.modules, "nbdist.magics", fake)
    monkeypatch.setattr("IPython.get_ipython", lambda: shell)
    assert [c for _, c in cells(picture([150, 250]))] == [RANK1, None]


def test_mapping_owner_maps_values_to_ranks_and_leaves_the_rest_neutral():
    p = picture(torch.tensor([7, 8, 9]), owner={7: 1, 8: 0})
    assert cells(p) == [("7", RANK1), ("8", RANK0), ("9", None)]


def test_int_owner_colours_every_value_with_that_rank():
    assert {c for _, c in cells(picture(torch.ones(2, 3), owner=3))} == {RANK3}


def test_per_element_owner_colours_each_cell_with_none_or_negative_neutral():
    values = torch.tensor([[5, 6], [7, 8]])
    assert [c for _, c in cells(picture(values, owner=torch.tensor([[1, 0], [-1, 2]])))] == [RANK1, RANK0, None, RANK2]
    assert [c for _, c in cells(picture(values, owner=[[None, 1], [1, 1]]))] == [None, RANK1, RANK1, RANK1]
    assert [c for _, c in cells(picture(values, owner=np.array([[0, 0], [0, 1]])))] == [RANK0] * 3 + [RANK1]


def test_callable_owner_is_asked_for_each_value():
    p = picture([1, 2, 3], owner=lambda v: None if v == 2 else v % 2)
    assert [c for _, c in cells(p)] == [RANK1, None, RANK1]


def test_false_owner_colours_nothing_and_says_so():
    p = picture(torch.tensor([0, 100, 200]), owner=False)
    assert [c for _, c in cells(p)] == [None, None, None]
    assert "not coloured by rank" in p.html and 'title="rank' not in p.html
    assert p.text.splitlines()[-1].split()[-3:] == ["-", "-", "-"]


def test_ranks_past_the_palette_cycle_its_colours_but_keep_their_names():
    p = picture([1, 2], owner=lambda v: 8 * (v - 1))
    assert [c for _, c in cells(p)] == [RANK0, RANK0]
    assert 'title="rank 8"' in p.html and "rank 8</span>" in p.html


@pytest.mark.parametrize(
    ("owner", "message"),
    [
        (torch.tensor([0, 1]), r"shape \(2,\).*shape \(3,\)"),
        ([[0, 1, 2]], r"shape \(1, 3\)"),
        ("abc", "owner must be"),
        (1.5, "owner must be"),
        (True, "owner=True"),
        (-1, "rank >= 0"),
        ({1: "zero"}, "int or None"),
        (lambda v: 1.0, "int or None"),
    ],
)
def test_an_owner_that_does_not_fit_raises_a_clear_value_error(owner, message):
    with pytest.raises(ValueError, match=message):
        picture(torch.tensor([1, 2, 3]), owner=owner)


def test_a_bad_owner_raises_even_for_a_summarised_tensor():
    with pytest.raises(ValueError, match="owner must be"):
        picture(torch.zeros(2, 2, 2), owner=object())


@pytest.mark.parametrize("world_size", [0, -2, True, 2.0])
def test_a_bad_world_size_raises(world_size):
    with pytest.raises(ValueError, match="world_size"):
        picture([1], world_size=world_size)


def test_more_than_256_values_are_summarised_with_shape_dtype_and_first_values():
    p = picture(torch.arange(300))
    assert "<table" not in p.html and "<td" not in p.html
    for form in (p.text, p.html):
        assert "shape (300,) · int64" in form and "0 1 2 3 4 5 6 7 …" in form and "8 9" not in form


def test_more_than_32_columns_are_summarised():
    p = picture(torch.zeros(2, 33))
    assert "<table" not in p.html and "more than 32 columns" in p.text


def test_a_3d_tensor_is_summarised():
    p = picture(torch.arange(24, dtype=torch.float32).reshape(2, 3, 4), "x")
    assert "<table" not in p.html
    assert p.text.splitlines()[:2] == ["x", "shape (2, 3, 4) · float32 · 24 values, not drawn (3-D)"]


def test_an_empty_tensor_is_summarised_as_empty():
    assert picture(torch.zeros(0, 3)).text == "shape (0, 3) · float32 · 0 values, not drawn (empty)"


def test_complex_and_object_values_are_summarised_not_drawn():
    assert "complex64 values are not drawn" in picture(torch.tensor([1 + 2j])).text
    p = picture(["<b>a</b>", "b"])
    assert "<table" not in p.html and "&lt;b&gt;a&lt;/b&gt;" in p.html


def test_a_0d_tensor_is_drawn_as_one_cell():
    p = picture(torch.tensor(101))
    assert cells(p) == [("101", RANK1)] and "shape () · int64" in p.text


def test_numpy_arrays_nested_lists_and_scalars_are_drawn():
    assert [t for t, _ in cells(picture(np.array([[1, 2], [3, 4]])))] == ["1", "2", "3", "4"]
    assert "shape (2, 2) · int" in picture([[1, 2], [3, 4]]).text
    assert cells(picture(5)) == [("5", RANK0)]
    with pytest.raises(ValueError, match="ragged"):
        picture([[1, 2], [3]])


def test_floats_are_compact_with_minus_zero_as_zero_and_nan_inf_as_python_writes_them():
    values = [1 / 3, -0.0, float("nan"), float("inf"), -float("inf"), 1e20, 2.0]
    texts = [t for t, _ in cells(picture(values))]
    assert texts == ["0.3333", "0", "nan", "inf", "-inf", "1e+20", "2"]


def test_bools_are_drawn_as_true_and_false():
    assert [t for t, _ in cells(picture(torch.tensor([True, False])))] == ["True", "False"]


def test_the_html_comes_through_the_sanitiser_unchanged():
    for tensor in (torch.tensor([[0, 1, 100, 101], [200, 201, 300, 301]]), torch.tensor(3.5), torch.arange(500)):
        p = picture(tensor, "before <b> & \"'", world_size=4)
        assert clean_html(p.html) == p.html


def test_the_html_is_static_with_inline_styles_of_allowed_properties_only():
    p = picture(torch.tensor([[0, 100], [-1, 5]]), "label", owner={0: 0, 100: 1})
    parsed = _Tags(p.html)
    assert {tag for tag, _ in parsed.tags} <= {"div", "span", "table", "tbody", "tr", "td"}
    assert {name for _, attrs in parsed.tags for name in attrs} <= {"style", "title"}
    properties = {d.split(":")[0] for _, attrs in parsed.tags for d in (attrs.get("style") or "").split(";") if d}
    assert properties <= STYLE_PROPERTIES
    for forbidden in ("<script", "<svg", "<style", "class=", "id="):
        assert forbidden not in p.html


def test_each_coloured_cell_sets_background_and_text_colour():
    for _, attrs in _Tags(picture(torch.arange(0, 800, 100)).html).cells:
        style = attrs["style"]
        assert re.search(r"background-color:#[0-9A-F]{6};color:#(000000|FFFFFF);", style)


def test_neutral_cells_inherit_the_text_colour():
    ((_, attrs),) = _Tags(picture([999], world_size=1).html).cells
    assert f"background-color:{NEUTRAL}" in attrs["style"] and ";color:" not in attrs["style"]


@pytest.mark.parametrize("background", PALETTE)
def test_text_on_each_palette_colour_has_wcag_contrast_at_least_4_5(background):
    assert contrast(background, text_colour(background)) >= 4.5


def test_the_legend_names_each_rank_present_with_its_colour():
    p = picture(torch.tensor([100, 0, 101]), world_size=2)
    legend = p.html.split("</table>")[1]
    assert re.findall(r'title="rank (\d)" style="background-color:([^;]+);', legend) == [("0", RANK0), ("1", RANK1)]


def test_a_malicious_label_is_escaped():
    p = picture([1], '<script>alert(1)</script>"onmouseover="alert(1)')
    assert "<script" not in p.html and "&lt;script&gt;alert(1)&lt;/script&gt;" in p.html
    assert all("onmouseover" not in attrs for _, attrs in _Tags(p.html).tags)
    assert p.text.splitlines()[0] == '<script>alert(1)</script>"onmouseover="alert(1)'


def test_the_label_and_shape_are_shown_above_the_grid():
    p = picture(torch.arange(4), "before")
    assert p.html.index('font-weight:bold">before</span>') < p.html.index("shape (4,) · int64") < p.html.index("<table")


def test_text_plain_shows_values_and_owning_ranks_compactly():
    p = picture(torch.tensor([[0, 1, 100, 101], [200, 201, 300, 999]]), "before", world_size=4)
    assert p.text == (
        "before\n"
        "shape (2, 4) · int64\n"
        "values               ranks\n"
        "  0    1  100  101   0 0 1 1\n"
        "200  201  300  999   2 2 3 -"
    )
    assert repr(p) == p.text


def test_the_same_tensor_always_gives_the_same_picture():
    first = picture(torch.tensor([[0.5, 100], [200, 3]]), "x")
    assert picture(torch.tensor([[0.5, 100], [200, 3]]), "x") == first


def test_the_mimebundle_has_text_and_html_and_honours_include_and_exclude():
    p = picture([1, 2])
    assert p._repr_mimebundle_() == {"text/plain": p.text, "text/html": p.html}
    assert p._repr_mimebundle_(include=["text/html"]) == {"text/html": p.html}
    assert p._repr_mimebundle_(exclude=["text/html"]) == {"text/plain": p.text}


def test_show_displays_the_picture_and_returns_none(monkeypatch):
    shown = []
    monkeypatch.setattr(picture_module, "display", shown.append)
    assert show(torch.tensor([1, 2]), "after") is None
    assert shown == [picture(torch.tensor([1, 2]), "after")]


def test_nbdist_exports_picture_and_show_and_importing_nbdist_still_imports_no_torch():
    assert {"picture", "show"} <= set(nbdist.__all__)
    assert nbdist.picture([100]).text == picture([100]).text
    code = "import sys, nbdist; assert 'torch' not in sys.modules; print(nbdist.picture([1, 2]).text.split()[-1])"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert run.stdout.strip() == "0"


def test_a_tensor_on_another_device_or_needing_grad_is_drawn_from_a_cpu_copy():
    assert [t for t, _ in cells(picture(torch.tensor([1.0, 2.0], requires_grad=True)))] == ["1", "2"]


def test_a_tensor_as_a_cells_last_expression_is_drawn_in_the_out_row_with_torchs_own_text():
    from IPython.core.interactiveshell import InteractiveShell

    from nbdist.cell import capture

    value = torch.tensor([0, 100])
    data = capture._format_value(InteractiveShell.instance(), value)
    assert data["text/plain"] == repr(value)
    assert 'title="rank 0"' in data["text/html"] and 'title="rank 1"' in data["text/html"]
