"""One look per method in every plot of a project: a colour, a marker and a line style.

A method's style is fixed by the project's parameters alone, never by the other methods a plot
happens to show, so a method looks the same in both plots of a table, in every table and in every
figure (``figures.<name>``) of one set of parameters:

- Methods are styled one after another in the *style order* (:func:`style_order`: the methods of the
  tables, table by table, then every other method in the order ``methods`` defines them).
- The i-th trained method takes the colour ``PALETTE[i mod 20]`` and the marker ``MARKERS[i mod 13]``,
  solid lines: 20 and 13 have no common factor, so no two of the first 260 share both.
- Except that methods drawn together (a table's rows, a figure's ``methods``: :func:`style_groups`) never
  share a colour, nor a marker where that can be helped: a method whose colour (marker) is taken by one
  drawn with it moves on to the next free one. A plot of up to 20 trained methods of one table or
  figure so has 20 distinct colours.
- No two methods of the project ever share both colour and marker (up to 260 trained methods).
- Reference rows (``recipe: reference``: untrained, frozen pretrained features) are drawn apart:
  dashed, in black and grey (colours no trained method takes), hollow markers of their own.

An overlay that adds a table, a figure or a method may restyle the methods it draws together, and only
where they would share a colour.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Colours of trained methods: tab10 without its grey, four hues it lacks (navy, moss, plum, gold: tab20b),
#: then the strongest pale shades of tab20 (weak on white, so last).
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
    "#393b79", "#637939", "#7b4173", "#e7ba52",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
)  # fmt: skip
#: Markers; their number (13) is coprime with the palette's (20).
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "p", "h", "*", "d")
#: Colours of reference rows (none of them in :data:`PALETTE`).
REFERENCE_COLORS = ("#000000", "#808080")
#: Where reference rows start in :data:`MARKERS` (the trained methods' first markers are the commonest).
REFERENCE_MARKER_OFFSET = 7
TRAINED_LINESTYLE = "-"
REFERENCE_LINESTYLE = "--"


@dataclass(frozen=True)
class Style:
    """How one method is drawn."""

    color: str
    marker: str
    linestyle: str
    reference: bool = False

    def line(self) -> dict[str, Any]:
        """Keyword arguments of ``Axes.plot`` / ``Axes.errorbar`` (reference rows' markers hollow)."""
        return {
            "color": self.color,
            "marker": self.marker,
            "linestyle": self.linestyle,
            "markerfacecolor": "white" if self.reference else self.color,
        }


class Styles:
    """The styles of a set of names, assigned as the module says.

    Args:
        order: the names in the order they are styled.
        references: the names that are reference rows.
        groups: names drawn together (they get distinct colours, and markers where possible).
        fixed: styles already given (kept as they are; the others avoid their colour-marker pairs).

    >>> styles = Styles(["untrained", "margin", "triplet"], references=["untrained"])
    >>> styles["triplet"]
    Style(color='#ff7f0e', marker='s', linestyle='-', reference=False)
    >>> styles["untrained"].linestyle, styles["untrained"].color
    ('--', '#000000')
    >>> together = Styles([f"m{i}" for i in range(22)], groups=[["m0", "m20"]])  # m20 would repeat m0's colour
    >>> together["m0"].color == together["m20"].color, together["m1"].color == together["m21"].color
    (False, True)
    """

    def __init__(
        self,
        order: Iterable[str] = (),
        references: Collection[str] = (),
        groups: Iterable[Iterable[str]] = (),
        fixed: Mapping[str, Style] | None = None,
    ) -> None:
        self._styles: dict[str, Style] = dict(fixed or {})
        self._references = frozenset(references) | {name for name, style in self._styles.items() if style.reference}
        neighbours: dict[str, set[str]] = {}
        for group in map(list, groups):
            for name in group:
                neighbours.setdefault(name, set()).update(group)
        used = {(style.color, style.marker) for style in self._styles.values()}
        counts = {kind: sum(style.reference == kind for style in self._styles.values()) for kind in (True, False)}
        for name in dict.fromkeys(order):
            if name in self._styles:
                continue
            reference = name in self._references
            near = [self._styles[n] for n in neighbours.get(name, ()) if n in self._styles and n != name]
            style = _next_style(counts[reference], reference, {s.color for s in near}, {s.marker for s in near}, used)
            counts[reference] += 1
            used.add((style.color, style.marker))
            self._styles[name] = style

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Styles:
        """The project's styles (:func:`style_order`, :func:`reference_methods`, :func:`style_groups`)."""
        return cls(style_order(config), reference_methods(config), style_groups(config))

    def including(self, names: Iterable[str]) -> Styles:
        """These styles, and styles for the ``names`` they lack, distinct from those of ``names`` they have."""
        names = list(names)
        return Styles(names, self._references, [names], fixed=self._styles)

    def is_reference(self, name: str) -> bool:
        return name in self._references

    def __contains__(self, name: object) -> bool:
        return name in self._styles

    def __getitem__(self, name: str) -> Style:
        try:
            return self._styles[name]
        except KeyError:
            raise KeyError(f"no style for {name!r}: not one of the {len(self._styles)} styled names") from None


def _next_style(
    index: int, reference: bool, near_colors: set[str], near_markers: set[str], used: set[tuple[str, str]]
) -> Style:
    """The style of the ``index``-th trained (or reference) name: its own colour and marker (``index`` mod the
    palette and the markers) unless a name drawn with it has that colour (marker), then the next free one;
    never a colour-marker pair that another name has (while one is free)."""
    colors = REFERENCE_COLORS if reference else PALETTE
    start = index + (REFERENCE_MARKER_OFFSET if reference else 0)

    def preference(pair: tuple[int, int]) -> tuple[bool, bool, bool, int, int]:
        c, m = pair
        color, marker = colors[(index + c) % len(colors)], MARKERS[(start + m) % len(MARKERS)]
        return (color, marker) in used, color in near_colors, marker in near_markers, c, m

    c, m = min(((c, m) for c in range(len(colors)) for m in range(len(MARKERS))), key=preference)
    return Style(
        colors[(index + c) % len(colors)],
        MARKERS[(start + m) % len(MARKERS)],
        REFERENCE_LINESTYLE if reference else TRAINED_LINESTYLE,
        reference=reference,
    )


def style_order(config: Mapping[str, Any]) -> list[str]:
    """The project's methods in the order they are styled: each table's methods (tables in the order ``tables``
    defines them), then the remaining ``methods`` in definition order."""
    tables = config.get("tables") or {}
    listed = [m for table in tables.values() if isinstance(table, Mapping) for m in table.get("methods") or []]
    return list(dict.fromkeys([*listed, *(config.get("methods") or {})]))


def style_groups(config: Mapping[str, Any]) -> list[list[str]]:
    """The methods drawn together: each table's rows and each figure's ``methods``."""
    specs = [*(config.get("tables") or {}).values(), *(config.get("figures") or {}).values()]
    return [
        list(spec["methods"]) for spec in specs if isinstance(spec, Mapping) and isinstance(spec.get("methods"), list)
    ]


def reference_methods(config: Mapping[str, Any]) -> list[str]:
    """The reference rows of a project: its methods with ``recipe: reference`` (own or inherited)."""
    from dmlbench.config import resolve_method

    return [m for m in config.get("methods") or {} if resolve_method(config, m).get("recipe") == "reference"]
