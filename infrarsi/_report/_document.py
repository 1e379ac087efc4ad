"""A small document model rendered two ways: Markdown (plots as files beside it) and one
self-contained HTML page (plots inline, styles inline, no script, nothing fetched)."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

__all__ = ["Document"]

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
       color: #1a1a1a; line-height: 1.45; }
h1 { border-bottom: 2px solid #2166ac; padding-bottom: .3rem; }
h2 { margin-top: 2.2rem; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .8rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .25rem .55rem; text-align: left; vertical-align: top; }
th { background: #f0f4f8; }
pre { background: #f6f8fa; padding: .7rem; overflow-x: auto; font-size: .82rem; }
figure { margin: 1rem 0; } figure svg { max-width: 100%; height: auto; }
.pass { color: #1b7837; font-weight: 600; } .fail, .unchecked { color: #b2182b; font-weight: 600; }
.skipped { color: #777; }
"""


@dataclass
class Document:
    title: str
    blocks: list[tuple] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("h", level, text))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append(("ul", list(items)))

    def table(self, headers: list[str], rows: list[list]) -> None:
        self.blocks.append(("table", list(headers), [[("" if c is None else str(c)) for c in r] for r in rows]))

    def code(self, text: str, lang: str = "") -> None:
        self.blocks.append(("code", lang, text))

    def plot(self, name: str, caption: str, svg: str) -> None:
        self.blocks.append(("plot", name, caption, svg))

    def plots(self) -> dict[str, str]:
        """Plot file name -> SVG text, for the files beside the Markdown."""
        return {b[1]: b[3] for b in self.blocks if b[0] == "plot"}

    def markdown(self, plot_dir: str) -> str:
        out = [f"# {_one_line(self.title)}", ""]
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                out += ["#" * block[1] + " " + _one_line(block[2]), ""]
            elif kind == "p":
                out += [block[1], ""]
            elif kind == "ul":
                out += [f"- {item}" for item in block[1]] + [""]
            elif kind == "table":
                out.append("| " + " | ".join(_md_cell(h) for h in block[1]) + " |")
                out.append("|" + "---|" * len(block[1]))
                out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block[2]]
                out.append("")
            elif kind == "code":
                fence = _fence(block[2])
                out += [fence + block[1], block[2].rstrip("\n"), fence, ""]
            elif kind == "plot":
                out += [f"![{block[2]}]({plot_dir}/{block[1]})", ""]
        return "\n".join(out).rstrip() + "\n"

    def html(self) -> str:
        out = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            # No script, no fetch: a page that cannot reach anything.
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "style-src 'unsafe-inline'; img-src data:\">",
            f"<title>{_e(self.title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{_e(self.title)}</h1>",
        ]
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                out.append(f"<h{block[1]}>{_e(block[2])}</h{block[1]}>")
            elif kind == "p":
                out.append(f"<p>{_inline(block[1])}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block[1]) + "</ul>")
            elif kind == "table":
                head = "".join(f"<th>{_e(h)}</th>" for h in block[1])
                body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in block[2])
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            elif kind == "code":
                out.append(f"<pre><code>{_e(block[2])}</code></pre>")
            elif kind == "plot":
                out.append(
                    f'<figure class="plot" id="plot-{_e(block[1].rsplit(".", 1)[0])}">{block[3]}'
                    f"<figcaption>{_e(block[2])}</figcaption></figure>"
                )
        out.append("</body></html>")
        return "\n".join(out) + "\n"


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _inline(text: str) -> str:
    """`code` spans and **bold** in a paragraph; everything else escaped."""
    parts = _e(text).split("`")
    for i in range(1, len(parts), 2):
        parts[i] = f"<code>{parts[i]}</code>"
    joined = "".join(parts)
    bold = joined.split("**")
    for i in range(1, len(bold), 2):
        bold[i] = f"<strong>{bold[i]}</strong>"
    return "".join(bold)


def _td(cell: str) -> str:
    if cell in ("pass", "fail", "unchecked", "skipped"):
        return f'<td class="{cell}">{cell}</td>'
    return f"<td>{_inline(cell)}</td>"


def _one_line(text: str) -> str:
    """A heading stays one line whatever a contract's name holds."""
    return " ".join(text.split())


def _fence(text: str) -> str:
    """A backtick fence longer than any run of backticks in ``text``, so a diff cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
