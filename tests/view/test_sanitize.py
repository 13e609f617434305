"""Another rank's text/html through nbdist.view.sanitize: structure kept, everything active removed (no kernel)."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from IPython.display import HTML

from nbdist.view.sanitize import clean_html, strip_to_text

PNG = "data:image/png;base64,iVBORw0KGgo="
SVG_B64 = "data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+PC9zdmc+"  # <svg onload=alert(1)></svg>
JS_ENTITIES = "".join(f"&#{ord(c)};" for c in "javascript:alert('XSS')")  # &#106;&#97;&#118;...&#39;&#41;
COVER = '<div style="position:fixed;top:0;left:0;width:100%;height:100%;z-index:9999;background:red">cover</div>'

ATTACKS = [
    "<img src=x onerror=alert(1)>",
    "<IMG SRC=\"javascript:alert('XSS');\">",
    "<IMG SRC=JaVaScRiPt:alert('XSS')>",
    f"<IMG SRC={JS_ENTITIES}>",
    '<a href="jav&#x09;ascript:alert(1)">x</a>',
    '<a href=" javascript:alert(1)">',
    '<a href="JAVASCRIPT:alert(1)">x</a>',
    "<svg onload=alert(1)>",
    "<svg><script>alert(1)</script></svg>",
    "<body onload=alert(1)>",
    '<iframe src="https://example.org">',
    "<form action=x><input name=a><button>go</button></form>",
    "<style>body{display:none}</style>",
    COVER,
    '<div style="background-color: expression(alert(1))">x</div>',
    '<div style="width: url(javascript:alert(1))">x</div>',
    '<div style="width: ex\\70 ression(alert(1))">x</div>',
    '<div style="color: red\\3b position: fixed">x</div>',
    '<a href="data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==">x</a>',
    f'<img src="{SVG_B64}">',
    '<img src="http://example.org/track.png">',
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>",
    '<div id="site-header">x</div>',
    '<a href="https://pytorch.org" target="_blank">torch</a>',
    "<!-- comment --><b>x</b>",
    "<!--[if IE]><script>alert(1)</script><![endif]-->",
    '<meta http-equiv="refresh" content="0;url=https://example.org">',
    '<link rel="stylesheet" href="https://example.org/x.css">',
    '<object data="https://example.org/x.swf">o</object><embed src="https://example.org/x.swf">',
    "<details ontoggle=alert(1) open><summary>more</summary>body</details>",
]


def _dataframe() -> pd.DataFrame:
    index = pd.Index(["r0", "r1", "r2"], name="rank")
    return pd.DataFrame({"loss": [0.5, 0.25, 0.125], "step": [1, 2, 3]}, index=index)


def _tags(markup: str) -> list[str]:
    return re.findall(r"<[^>]*>", markup)


@pytest.mark.parametrize("attack", ATTACKS)
def test_no_attack_leaves_a_script_handler_javascript_url_frame_form_style_or_positioning(attack: str) -> None:
    out = clean_html(attack)
    for banned in ("<script", "javascript:", "<iframe", "<form", "<style", "position:", "<svg", "<math"):
        assert banned not in out.lower(), (banned, out)
    assert not any(re.search(r"\son\w+\s*=", tag, re.IGNORECASE) for tag in _tags(out)), out


def test_a_pandas_dataframe_keeps_its_table_and_values_and_loses_its_style_block() -> None:
    markup = _dataframe()._repr_html_()
    assert "<style" in markup  # pandas emits scoped CSS in front of its table
    out = clean_html(markup)
    assert "<style" not in out and ".dataframe tbody" not in out
    assert '<table border="1" class="dataframe">' in out
    for tag in ("<thead>", "<tbody>", "<th>", "<td>", "</table>"):
        assert tag in out
    for value in ("loss", "step", "rank", "r0", "r1", "r2", "0.500", "0.250", "0.125"):
        assert f">{value}<" in out
    assert out.count("<tr") == markup.count("<tr") == 5
    assert '<tr style="text-align:right">' in out


def test_ipython_html_keeps_bold_italic_and_code() -> None:
    assert clean_html(HTML("<b>bold</b> <i>x</i> <code>y</code>").data) == "<b>bold</b> <i>x</i> <code>y</code>"


def test_structural_and_text_tags_survive_unchanged() -> None:
    markup = (
        '<h3>t</h3><p>a<br>b</p><hr><ul><li>u</li></ul><ol start="3"><li>o</li></ol><dl><dt>k</dt><dd>v</dd></dl>'
        "<blockquote>q</blockquote><pre><kbd>k</kbd> <samp>s</samp> <var>v</var></pre><small>s</small>"
        "<sub>1</sub><sup>2</sup><mark>m</mark><s>x</s><u>u</u><em>e</em><strong>S</strong>"
        '<abbr title="all-reduce">AR</abbr><figure><figcaption>c</figcaption></figure>'
    )
    assert clean_html(markup) == markup


def test_a_table_keeps_spans_and_table_attributes_but_not_ids_or_handlers() -> None:
    out = clean_html(
        '<table border="1" cellpadding="2" cellspacing="0" id="t" onclick="x()"><caption>c</caption>'
        '<tr><td colspan="2" rowspan="1" valign="top" align="left" id="c">a</td></tr></table>'
    )
    assert out == (
        '<table border="1" cellpadding="2" cellspacing="0"><caption>c</caption>'
        '<tbody><tr><td colspan="2" rowspan="1" valign="top" align="left">a</td></tr></tbody></table>'
    )


def test_img_with_onerror_loses_the_handler_and_its_src() -> None:
    assert clean_html("<img src=x onerror=alert(1)>") == "<img>"


@pytest.mark.parametrize(
    "attack",
    ["<IMG SRC=\"javascript:alert('XSS');\">", "<IMG SRC=JaVaScRiPt:alert('XSS')>", f"<IMG SRC={JS_ENTITIES}>"],
)
def test_img_javascript_src_is_dropped_however_it_is_cased_or_entity_encoded(attack: str) -> None:
    assert clean_html(attack) == "<img>"


@pytest.mark.parametrize(
    "attack",
    [
        '<a href="jav&#x09;ascript:alert(1)">x</a>',
        '<a href=" javascript:alert(1)">x</a>',
        '<a href="JAVASCRIPT:alert(1)">x</a>',
        '<a href="vbscript:msgbox(1)">x</a>',
        '<a href="data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==">x</a>',
        '<a href="/api/contents">x</a>',
    ],
)
def test_a_link_that_is_not_http_https_or_mailto_loses_its_href_and_keeps_its_text(attack: str) -> None:
    assert clean_html(attack) == '<a rel="noopener noreferrer">x</a>'


def test_an_https_link_keeps_its_href_gains_rel_noopener_and_loses_target() -> None:
    out = clean_html('<a href="https://pytorch.org" target="_blank">torch</a>')
    assert out == '<a href="https://pytorch.org" rel="noopener noreferrer">torch</a>'


def test_a_mailto_link_is_kept() -> None:
    assert clean_html('<a href="mailto:ops@example.org">ops</a>') == (
        '<a href="mailto:ops@example.org" rel="noopener noreferrer">ops</a>'
    )


@pytest.mark.parametrize("markup", ["<svg onload=alert(1)></svg>", "<svg><script>alert(1)</script></svg>"])
def test_svg_is_removed_with_its_content(markup: str) -> None:
    assert clean_html(markup + "after") == "after"


def test_an_unclosed_svg_swallows_the_rest_of_the_fragment() -> None:
    assert clean_html("<svg onload=alert(1)>after") == ""


def test_body_onload_loses_the_tag_and_keeps_the_text() -> None:
    assert clean_html("<body onload=alert(1)>hi") == "hi"


@pytest.mark.parametrize(
    "markup",
    [
        '<iframe src="https://example.org">inside</iframe>',
        "<form action=x><input name=a><button>go</button></form>",
        "<style>body{display:none}</style>",
        "<script>alert(1)</script>",
        "<template><b>t</b></template>",
        "<textarea><b>t</b></textarea>",
        "<title>t</title>",
        "<noscript><b>t</b></noscript>",
        '<object data="https://example.org/x">o</object>',
        '<embed src="https://example.org/x">',
        "<math><mi>x</mi></math>",
    ],
)
def test_frames_forms_styles_scripts_and_embeds_are_removed_with_their_content(markup: str) -> None:
    assert clean_html(markup + "<b>kept</b>") == "<b>kept</b>"


@pytest.mark.parametrize(
    "markup",
    [
        '<meta http-equiv="refresh" content="0;url=https://example.org">',
        '<base href="https://example.org/">',
        '<link rel="stylesheet" href="https://example.org/x.css">',
    ],
)
def test_page_level_tags_are_dropped(markup: str) -> None:
    assert clean_html(markup + "t") == "t"


def test_unknown_and_form_control_tags_are_stripped_and_their_text_kept() -> None:
    assert clean_html("<button>go</button><select><option>a</option></select><blink>b</blink>") == "goab"


def test_a_full_page_cover_loses_position_offsets_z_index_and_background_but_keeps_its_text() -> None:
    out = clean_html(COVER)
    assert out == '<div style="width:100%;height:100%">cover</div>'
    for prop in ("position", "top", "left", "z-index", "background"):
        assert f"{prop}:" not in out


@pytest.mark.parametrize(
    "style",
    [
        "background-color: expression(alert(1))",
        "width: url(javascript:alert(1))",
        "background-color: url(https://example.org/track.png)",
        "width: EXPRESSION(alert(1))",
        "width: expression (alert(1))",
    ],
)
def test_url_and_expression_inside_an_allowed_property_drop_the_declaration(style: str) -> None:
    assert clean_html(f'<div style="{style}; color: red">x</div>') == '<div style="color:red">x</div>'


@pytest.mark.parametrize(
    "style", ["width: ex\\70 ression(alert(1))", "color: red\\3b position: fixed", "width: u/**/rl(x); color: red"]
)
def test_a_style_with_css_escapes_or_comments_is_dropped_whole(style: str) -> None:
    assert clean_html(f'<div style="{style}">x</div>') == "<div>x</div>"


def test_only_presentation_style_properties_are_kept() -> None:
    style = (
        "color: red; background-color: #eee; text-align: right; vertical-align: top; font-weight: bold;"
        " font-style: italic; font-size: 12px; font-family: monospace; text-decoration: underline;"
        " white-space: pre; padding: 1px 2px; padding-left: 3px; border: 1px solid black; border-top-width: 2px;"
        " border-collapse: collapse; border-spacing: 0; width: 10px; min-width: 1px; max-width: 90%; height: 2em;"
        " line-height: 1.2; margin: -999px; display: none; float: left; overflow: visible; opacity: 0;"
        " transform: scale(9); background-image: none; content: 'x'; behavior: url(x.htc); -moz-binding: none"
    )
    out = clean_html(f'<span style="{style}">x</span>')
    kept = re.search(r'style="([^"]*)"', out).group(1)
    names = [declaration.split(":", 1)[0] for declaration in kept.split(";")]
    assert names == [
        "color", "background-color", "text-align", "vertical-align", "font-weight", "font-style", "font-size",
        "font-family", "text-decoration", "white-space", "padding", "padding-left", "border", "border-top-width",
        "border-collapse", "border-spacing", "width", "min-width", "max-width", "height", "line-height",
    ]  # fmt: skip


def test_an_empty_style_attribute_is_dropped_and_one_emptied_by_the_filter_stays_empty() -> None:
    assert clean_html('<div style="">x</div>') == "<div>x</div>"
    # nh3 filters properties after attribute_filter has run, so an emptied style stays as style="" (harmless).
    assert clean_html('<div style="position: fixed">x</div>') == '<div style="">x</div>'


def test_data_urls_other_than_base64_png_jpeg_gif_lose_the_img_src() -> None:
    assert clean_html(f'<img src="{SVG_B64}">') == "<img>"
    assert clean_html('<img src="data:text/html;base64,PHNjcmlwdD4=">') == "<img>"
    assert clean_html('<img src="data:image/png,raw">') == "<img>"


@pytest.mark.parametrize("src", ["http://example.org/track.png", "https://example.org/track.png", "/files/x.png", "x"])
def test_an_img_never_makes_this_notebook_fetch_a_url(src: str) -> None:
    assert clean_html(f'<img src="{src}" alt="a">') == '<img alt="a">'


@pytest.mark.parametrize("kind", ["png", "jpeg", "gif"])
def test_a_base64_png_jpeg_or_gif_img_is_kept_with_alt_and_size(kind: str) -> None:
    markup = f'<img src="data:image/{kind};base64,iVBORw0KGgo=" alt="loss" width="64" height="48">'
    assert clean_html(markup) == markup


def test_img_srcset_is_dropped() -> None:
    assert clean_html(f'<img src="{PNG}" srcset="https://example.org/a.png 2x">') == f'<img src="{PNG}">'


def test_the_mutation_xss_classic_through_math_leaves_nothing() -> None:
    assert clean_html("<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>") == ""


def test_ids_are_removed() -> None:
    assert clean_html('<div id="site-header">x</div>') == "<div>x</div>"


def test_comments_are_removed() -> None:
    assert clean_html("<!-- comment --><b>x</b>") == "<b>x</b>"
    assert clean_html("<!--[if IE]><script>alert(1)</script><![endif]--><b>x</b>") == "<b>x</b>"


def test_details_and_summary_are_kept() -> None:
    markup = "<details><summary>more</summary>body</details>"
    assert clean_html(markup) == markup
    assert clean_html("<details ontoggle=alert(1) open>" + markup[9:]) == markup


def test_text_is_escaped_not_unescaped() -> None:
    assert clean_html("<p>a &lt;script&gt; b &amp; c</p>") == "<p>a &lt;script&gt; b &amp; c</p>"


def test_strip_to_text_of_a_table_returns_its_cell_text() -> None:
    text = strip_to_text("<table><tr><th>rank</th><td>a &lt; 1</td></tr></table>")
    assert text == "ranka < 1"
    frame = strip_to_text(_dataframe()._repr_html_())
    assert "<" not in frame and ".dataframe" not in frame
    words = ["loss", "step", "rank", "r0", "0.500", "1", "r1", "0.250", "2", "r2", "0.125", "3"]
    assert re.findall(r"\S+", frame) == words


def test_strip_to_text_drops_scripts_styles_and_svg_with_their_content() -> None:
    assert strip_to_text("<script>s()</script><style>p{}</style><svg><text>t</text></svg><b>kept</b>") == "kept"


def test_only_pandas_table_class_survives_so_page_styles_cannot_place_rank_html() -> None:
    out = clean_html('<table class="dataframe jp-Dialog"><tr><td class="jp-Dialog lm-Widget">x</td></tr></table>')
    assert 'class="dataframe"' in out and "jp-Dialog" not in out and "lm-Widget" not in out
