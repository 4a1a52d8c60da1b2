"""Text and Markdown tables: one formatter for every table the package prints.

    format_table(["model", "acc"], [["resnet18", "0.938"]])
    model     acc
    --------  -----
    resnet18  0.938

    format_table(["model", "acc"], [["resnet18", "0.938"]], markdown=True, align="lr")
    | model | acc |
    |---|---:|
    | resnet18 | 0.938 |

Cells are strings, written as given (the caller rounds its numbers). No trailing newline.
`significant(x)` is how numbers read by people are rounded (report, explorer captions):
three significant digits, "0.903", "12.3", "1230", "1.23e-5".
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

_RULES = {"l": "---", "r": "---:"}


def significant(value: float | int | None, digits: int = 3) -> str:
    """`value` rounded to `digits` significant digits, as people read it: "0.903", "0.100", "12.3",
    "1230" (no exponent from 1e-4 up to a million), "1.23e-5" and "1.23e+6" beyond; "0" for zero,
    "-" for None or NaN, "inf" / "-inf". The explorer's page formats its numbers the same way
    (its `fmt`, JavaScript's toExponential / toFixed).
    """
    if value is None:
        return "-"
    value = float(value)
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    exponent = math.floor(math.log10(abs(float(f"{value:.{digits - 1}e}"))))  # after rounding: 999.7 -> 3
    if exponent < -4 or exponent >= 6:
        mantissa, power = f"{value:.{digits - 1}e}".split("e")
        return f"{mantissa}e{power[0]}{int(power[1:])}"  # 1.23e-5, as JavaScript writes it
    if exponent >= digits - 1:
        return f"{round(value, digits - 1 - exponent):.0f}"
    return f"{value:.{digits - 1 - exponent}f}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool = False,
                 align: str | None = None) -> str:
    """A table of `rows` under `headers`: plain text (columns padded to their widest cell,
    two spaces apart, a dashed rule under the header) or Markdown.

    A Markdown cell is escaped so that it renders as it reads (`_markdown_cell`; `markdown_cells` reads it back).
    `align`: one letter per column, "l" (left, the default) or "r" (right); in Markdown it
    sets the rule's alignment marks ("---" / "---:"), in text the padding side.
    """
    headers = [str(h) for h in headers]
    align = align or "l" * len(headers)
    if len(align) != len(headers) or set(align) - set(_RULES):
        raise ValueError(f"align must be one of 'l'/'r' per column ({len(headers)}), got {align!r}")
    rows = [[str(c) for c in r] for r in rows]
    for r in rows:
        if len(r) != len(headers):
            raise ValueError(f"a row has {len(r)} cells for {len(headers)} columns: {r}")
    if markdown:  # each cell (a run folder's name) escaped: rendered, it reads as it is
        lines = [[_markdown_cell(c) for c in cells] for cells in (headers, *rows)]
        lines = [lines[0], None, *lines[1:]]
        return "\n".join("|" + "|".join(_RULES[a] for a in align) + "|" if cells is None
                         else "| " + " | ".join(cells) + " |" for cells in lines)
    widths = [max(len(c) for c in column) for column in zip(headers, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


_MARKDOWN = set("\\|[]!*_`~$")  # escaped with a backslash in a Markdown cell (~~: strikethrough, $: math)


def _markdown_cell(text: str) -> str:
    """A cell as Markdown writes it: a backslash, `|` and what Markdown reads as markup (links, images, emphasis,
    code, GitHub's strikethrough and math) escaped with a backslash, `&`, `<` and `>` as entities (no HTML), spaces
    at its ends as entities."""
    escaped = html.escape("".join("\\" + c if c in _MARKDOWN else c for c in text), quote=False)
    lead, trail = len(escaped) - len(escaped.lstrip(" ")), len(escaped) - len(escaped.rstrip(" "))
    return "&#32;" * lead + escaped.strip(" ") + "&#32;" * trail  # the padding would take spaces at the ends


def markdown_cells(line: str) -> list[str]:
    """The cells of one row of a Markdown table `format_table` wrote, as they were given: split at its unescaped `|`s,
    the escapes undone."""
    cells, cell, escaped = [], [], False
    for c in line.strip().removeprefix("|"):
        if escaped:
            cell.append(c)
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == "|":
            cells.append("".join(cell))
            cell = []
        else:
            cell.append(c)
    return [html.unescape(c.strip()) for c in cells]


# one_line: what every message, and every name a command prints, shows of a string (the CLI's, the pages')
_SPECIAL = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _escape(c: str) -> str:
    if c in _SPECIAL:
        return _SPECIAL[c]
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:  # a byte that is not UTF-8, as Python decodes a file name: the byte, as bash writes it
        return f"\\x{n - 0xDC00:02x}"
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def one_line(text: str) -> str:
    """`text` as one line of plain text: characters that are not printable shown as escapes (`\\n`, `\\x1b`,
    `\\u202e`), and a backslash as two, so that an escape never passes for the characters it stands for (a file named
    `a\\nb.png` is not the one with a newline); a plain space and every letter, digit, mark and symbol of any script
    kept."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if (c.isprintable() and c != "\\") or c == " " else _escape(c) for c in text)
