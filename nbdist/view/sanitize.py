"""Another rank's text/html, made safe to embed in one cell of this notebook's table, through nh3 (ammonia).

Kept: structure and text (tables, lists, headings, emphasis, code, details), links to http/https/mailto
(rel="noopener noreferrer", no target), images only as inline base64 PNG/JPEG/GIF, and a few presentation
style properties. Removed: scripts, styles, forms, frames, embedded objects, event handlers, ids, comments,
any other URL (nothing the rank sends makes this notebook fetch a page or an image), and positioning CSS.
SVG and MathML are removed with their content: they carry their own scripting and styling, and are parsed
by other rules than HTML (the classic mutation-XSS route), so the renderer shows a rank's SVG as text.
One class name is kept, pandas' "dataframe" on tables: any other could pick up the notebook page's own
rules (a dialog's position:fixed, say) and let a rank cover the page.
"""

from __future__ import annotations

import html
import re

import nh3

TAGS = frozenset(
    {"table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption", "colgroup", "col"}
    | {"div", "span", "p", "br", "hr", "b", "i", "u", "s", "em", "strong", "small", "sub", "sup", "mark"}
    | {"code", "pre", "kbd", "samp", "var", "tt", "ul", "ol", "li", "dl", "dt", "dd"}
    | {"h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "details", "summary", "abbr", "a", "img"}
    | {"figure", "figcaption"}
)
# Removed together with everything inside them (nh3 refuses a tag that is both kept and content-cleaned).
REMOVED_WITH_CONTENT = frozenset(
    {"script", "style", "template", "textarea", "title", "noscript", "iframe", "object", "embed", "form", "svg", "math"}
)
ATTRIBUTES: dict[str, frozenset[str]] = {
    "*": frozenset({"title", "style", "align", "valign"}),  # class: only through allowed_classes below
    "th": frozenset({"colspan", "rowspan"}),
    "td": frozenset({"colspan", "rowspan"}),
    "table": frozenset({"border", "cellpadding", "cellspacing"}),
    "a": frozenset({"href"}),
    "img": frozenset({"src", "alt", "width", "height"}),
    "ol": frozenset({"start"}),
}
_SIDES = ("top", "right", "bottom", "left")
STYLE_PROPERTIES = frozenset(
    {"color", "background-color", "text-align", "vertical-align", "font-weight", "font-style", "font-size"}
    | {"font-family", "text-decoration", "white-space", "width", "min-width", "max-width", "height", "line-height"}
    | {"padding", *(f"padding-{side}" for side in _SIDES)}
    | {"border", "border-width", "border-style", "border-color", "border-collapse", "border-spacing"}
    | {f"border-{side}{part}" for side in _SIDES for part in ("", "-width", "-style", "-color")}
)
LINK_SCHEMES = ("http:", "https:", "mailto:")
# nh3 checks schemes on href and src together; "data" is let through for img src, and _attribute() keeps a
# data: URL only there, and only as a base64 PNG/JPEG/GIF (never image/svg+xml, which can carry script).
_URL_SCHEMES = {"http", "https", "mailto", "data"}
_IMAGE_SRC = re.compile(r"data:image/(?:png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*", re.IGNORECASE)
_URL_NOISE = re.compile(r"[\t\n\r]")  # browsers drop these inside a URL ("jav\tascript:" is javascript:)
_C0_AND_SPACE = "".join(map(chr, range(0x21)))
_STYLE_FUNCTION = re.compile(r"(?:url|expression)\(", re.IGNORECASE)


def _url(value: str) -> str:
    """A URL as a browser reads its scheme: outer spaces and control characters, and tabs and newlines, gone."""
    return _URL_NOISE.sub("", value.strip(_C0_AND_SPACE)).lower()


def _style(value: str) -> str | None:
    # nh3's filter_style_properties keeps url(...) and expression(...) inside allowed properties
    # (background-color:url("x"), width:expression(alert()), and decodes CSS escapes (ex\70 ression becomes
    # expression) after this filter has run on the raw value. So: a style with escapes or comments is dropped
    # whole, and any declaration naming url( or expression( is dropped; nh3 then filters the properties.
    if "\\" in value or "/*" in value:
        return None
    kept = [part for part in value.split(";") if not _STYLE_FUNCTION.search(re.sub(r"\s+", "", part))]
    style = ";".join(kept)
    return style if style.strip(" ;\t\n\r\f") else None


def _attribute(tag: str, name: str, value: str) -> str | None:
    """nh3's attribute_filter: called after nh3's own scheme check, before its style filter."""
    if tag == "img" and name == "src":
        return value if _IMAGE_SRC.fullmatch(value.strip()) else None
    if tag == "a" and name == "href":
        return value if _url(value).startswith(LINK_SCHEMES) else None
    if name == "style":
        return _style(value)
    return value


_CLEANER = nh3.Cleaner(
    tags=set(TAGS),
    clean_content_tags=set(REMOVED_WITH_CONTENT),
    attributes={tag: set(names) for tag, names in ATTRIBUTES.items()},
    attribute_filter=_attribute,
    strip_comments=True,
    link_rel="noopener noreferrer",
    url_schemes=_URL_SCHEMES,
    url_relative="deny",  # a relative URL would point at this notebook's own server
    filter_style_properties=set(STYLE_PROPERTIES),
    allowed_classes={"table": {"dataframe"}},
)
_TEXT = nh3.Cleaner(tags=set(), clean_content_tags=set(REMOVED_WITH_CONTENT), attributes={}, strip_comments=True)


def clean_html(markup: str) -> str:
    """Another rank's text/html, sanitised: structure kept (tables, lists, emphasis, code), anything that could
    run code, submit, load a page or escape its cell removed."""
    return _CLEANER.clean(markup)


def strip_to_text(markup: str) -> str:
    """The text of another rank's text/html, every tag gone (and script, style, svg... with their content).

    Plain text, not HTML: escape it before embedding it anywhere."""
    return html.unescape(_TEXT.clean(markup))
