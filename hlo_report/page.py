"""A report page as data, and the one function that writes it as a self-contained HTML file.

The page builders (``hlo_report.analysis``, ``pipeline``, ``plan``, ``study``) turn the JSON
and CSV that the commands write into a :class:`Page` of sections holding facts, tables,
figures (plotly specifications) and downloads; :func:`render_page` writes it. The HTML needs
nothing at view time: plotly's JavaScript is inlined from its Python package (the ``plot``
extra), the figures and the downloads are embedded as JSON, and the page's own script (sorting
the tables, drawing the figures, saving a download) is the few lines of ``_SCRIPT``.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hlo_trace.errors import UsageError

#: What a cell, a fact or a figure value may be.
Value = int | float | str | bool | None


@dataclass(frozen=True)
class Fact:
    """One number (or word) of a summary; ``key`` names it in the page (``data-key``)."""

    key: str
    label: str
    value: Value
    unit: str = ""


@dataclass(frozen=True)
class Column:
    name: str
    numeric: bool = True  # sorted by value, right-aligned; else by text, left-aligned


@dataclass(frozen=True)
class Table:
    """A sortable table: clicking a header sorts by that column (numbers by value)."""

    key: str
    title: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[Value, ...], ...]
    note: str = ""


@dataclass(frozen=True)
class Figure:
    """A plotly figure: ``data`` (traces) and ``layout`` as plotly.js reads them."""

    key: str
    title: str
    data: tuple[dict[str, Any], ...]
    layout: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class Download:
    """A file embedded in the page that a button saves (e.g. a Chrome trace for Perfetto)."""

    key: str
    label: str
    filename: str
    content: str
    note: str = ""


@dataclass(frozen=True)
class Text:
    text: str


Item = Fact | Table | Figure | Download | Text


@dataclass(frozen=True)
class Section:
    title: str
    items: tuple[Item, ...]


@dataclass(frozen=True)
class Page:
    title: str
    kind: str  # analysis, pipeline, plan, study: the page's data-kind
    sources: tuple[str, ...]  # the files it was made from
    sections: tuple[Section, ...]


#: Units a fact is scaled into for reading (its data-v keeps the exact number).
_SCALES = {"B": ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")),
           "s": ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))}
#: Bytes from a GiB up are also shown in GiB (chip capacities are GiB: 16 GiB = 17.18 GB).
GIB = 2**30


def shown(value: Value, unit: str = "") -> str:
    """A value as the page prints it: integers in full with thousands separators, other
    numbers to 4 significant digits, None as n/a; bytes and seconds in the largest unit that
    leaves at least 1 (41.9 us; bytes in decimal units as the study's tables, from a GiB up in
    GiB too: 17.18 GB (16 GiB))."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if unit in _SCALES and isinstance(value, (int, float)) and value > 0:
        for scale, name in _SCALES[unit]:
            if value >= scale:
                text = f"{value / scale:.4g} {name}"
                return f"{text} ({value / GIB:.4g} GiB)" if unit == "B" and value >= GIB else text
    if isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, float):
        text = f"{value:.4g}" if math.isfinite(value) else str(value)
    else:
        return str(value)
    return f"{text} {unit}" if unit else text


def _raw(value: Value) -> str:
    """A cell's sort key (``data-v``): the exact number, or empty for text and n/a."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    return repr(value)


def _script_json(value: Any) -> str:
    """JSON that can sit inside a <script> element (no ``</script>`` can end it early)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def plotly_js() -> str:
    """plotly.js, minified, from the plotly Python package (the ``plot`` extra)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise UsageError("hlo-report needs plotly for its figures: pip install -e '.[plot]'") from None
    return get_plotlyjs()


def _fact(fact: Fact) -> str:
    return (f'<div class="fact"><span class="label">{html.escape(fact.label)}</span> '
            f'<span class="value" data-key="{html.escape(fact.key)}" data-v="{_raw(fact.value)}">'
            f"{html.escape(shown(fact.value, fact.unit))}</span></div>")


def _align(column: Column) -> str:
    return "" if column.numeric else ' class="t"'


def _table(table: Table) -> Iterable[str]:
    yield f'<h3>{html.escape(table.title)}</h3>'
    if table.note:
        yield f'<p class="note">{html.escape(table.note)}</p>'
    yield (f'<div class="tablebox"><table class="sortable" id="table-{html.escape(table.key)}">'
           "<thead><tr>")
    for column in table.columns:
        kind = "num" if column.numeric else "text"
        yield (f'<th data-type="{kind}"{_align(column)} title="click to sort">'
               f"{html.escape(column.name)}</th>")
    yield "</tr></thead><tbody>"
    for row in table.rows:
        cells = "".join(f'<td data-v="{_raw(value)}"{_align(column)}>{html.escape(shown(value))}</td>'
                        for column, value in zip(table.columns, row))
        yield f"<tr>{cells}</tr>"
    yield "</tbody></table></div>"


#: The fields of a plotly trace or axis whose strings come from the input files (names of
#: ops, plans, stages, tracks): plotly draws its HTML-like markup in them (``<b>``, ``<a href>``,
#: ``<br>``), so they are written with ``<``, ``>`` and ``&`` as entities, which it shows as
#: the characters: a name is shown as text. (The hover templates are the page's own.)
_PLOTLY_TEXT_FIELDS = frozenset({"x", "y", "text", "hovertext", "name", "labels", "ticktext",
                                 "categoryarray"})


def _plotly_text(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if isinstance(value, list):
        return [_plotly_text(item) for item in value]
    return value


def _as_text(part: dict[str, Any]) -> dict[str, Any]:
    """A trace or a layout with the strings of :data:`_PLOTLY_TEXT_FIELDS` as text (axes
    included)."""
    return {key: _plotly_text(value) if key in _PLOTLY_TEXT_FIELDS
            else _as_text(value) if isinstance(value, dict) and key.startswith(("xaxis", "yaxis"))
            else value for key, value in part.items()}


def _figure(figure: Figure) -> Iterable[str]:
    yield f'<h3>{html.escape(figure.title)}</h3>'
    if figure.note:
        yield f'<p class="note">{html.escape(figure.note)}</p>'
    spec = {"data": [_as_text(trace) for trace in figure.data],
            "layout": _as_text({"margin": {"t": 30}, **figure.layout})}
    yield f'<div class="figure" id="figure-{html.escape(figure.key)}"></div>'
    yield (f'<script type="application/json" class="figure-spec" data-for="figure-'
           f'{html.escape(figure.key)}">{_script_json(spec)}</script>')


def _download(download: Download) -> Iterable[str]:
    if download.note:
        yield f'<p class="note">{html.escape(download.note)}</p>'
    yield (f'<button class="download" data-for="download-{html.escape(download.key)}" '
           f'data-filename="{html.escape(download.filename)}">{html.escape(download.label)}</button>')
    yield (f'<script type="application/json" id="download-{html.escape(download.key)}">'
           f'{_script_json(download.content)}</script>')


def _item(item: Item) -> Iterable[str]:
    if isinstance(item, Table):
        yield from _table(item)
    elif isinstance(item, Figure):
        yield from _figure(item)
    elif isinstance(item, Download):
        yield from _download(item)
    else:
        yield f"<p>{html.escape(item.text)}</p>"


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;margin-top:1.6em}h3{font-size:1.05em}
.sources,.note{color:#555;font-size:.9em}
.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(270px,1fr));gap:.3em 1.5em}
.fact .label{color:#555}.fact .value{font-weight:600}
.tablebox{max-height:32em;overflow:auto;border:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;width:100%}
th,td{padding:.2em .5em;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
td.t,th.t{text-align:left}
th{position:sticky;top:0;background:#f4f4f4;cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" \\25b2"}th[aria-sort=descending]::after{content:" \\25bc"}
.figure{width:100%;height:420px}
button.download{padding:.3em .8em;margin:.3em 0}
"""

# Sorting (numbers by data-v, n/a last; text by code points), drawing the figures, saving a download.
_SCRIPT = """
(function(){
function key(row,i,numeric){var c=row.cells[i];if(!numeric)return c.textContent;
 return c.dataset.v===''?NaN:Number(c.dataset.v);}
function sortBy(table,i,th){
 var asc=th.getAttribute('aria-sort')!=='ascending',numeric=th.dataset.type==='num';
 table.querySelectorAll('th').forEach(function(h){h.removeAttribute('aria-sort');});
 th.setAttribute('aria-sort',asc?'ascending':'descending');
 var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
 rows.sort(function(a,b){var x=key(a,i,numeric),y=key(b,i,numeric);
  if(numeric){if(isNaN(x))return isNaN(y)?0:1;if(isNaN(y))return -1;return asc?x-y:y-x;}
  var order=x<y?-1:(x>y?1:0);return asc?order:-order;});
 var fragment=document.createDocumentFragment();rows.forEach(function(r){fragment.appendChild(r);});
 body.appendChild(fragment);}
document.querySelectorAll('table.sortable').forEach(function(table){
 table.querySelectorAll('th').forEach(function(th,i){
  th.addEventListener('click',function(){sortBy(table,i,th);});});});
document.querySelectorAll('script.figure-spec').forEach(function(spec){
 var figure=JSON.parse(spec.textContent);
 Plotly.newPlot(spec.dataset.for,figure.data,figure.layout,{responsive:true,displaylogo:false});});
document.querySelectorAll('button.download').forEach(function(button){
 button.addEventListener('click',function(){
  var text=JSON.parse(document.getElementById(button.dataset.for).textContent);
  var link=document.createElement('a');
  link.href=URL.createObjectURL(new Blob([text],{type:'application/json'}));
  link.download=button.dataset.filename;link.click();});});
document.body.dataset.ready='yes';
})();
"""


def render_page(page: Page, javascript: str) -> Iterable[str]:
    """The page as HTML text in pieces; ``javascript`` is the plotting library (plotly_js())."""
    yield ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
           f'<title>{html.escape(page.title)}</title><style>{_STYLE}</style>'
           f'<script>{javascript}</script></head>\n')
    yield f'<body data-kind="{html.escape(page.kind)}"><h1>{html.escape(page.title)}</h1>\n'
    yield ('<p class="sources">Made by hlo-report from ' +
           ", ".join(f"<code>{html.escape(source)}</code>" for source in page.sources) + "</p>\n")
    for section in page.sections:
        yield f"<h2>{html.escape(section.title)}</h2>\n"
        facts = [item for item in section.items if isinstance(item, Fact)]
        if facts:
            yield '<div class="facts">' + "".join(map(_fact, facts)) + "</div>\n"
        for item in section.items:
            if not isinstance(item, Fact):
                yield "".join(_item(item)) + "\n"
    yield f"<script>{_SCRIPT}</script></body></html>\n"


def columns(*names: str, text: Sequence[str] = ()) -> tuple[Column, ...]:
    """Columns by name, numeric unless named in ``text``."""
    return tuple(Column(name, numeric=name not in text) for name in names)
