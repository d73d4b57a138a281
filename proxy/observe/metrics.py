"""Prometheus text exposition (format 0.0.4), written by hand.

Why not ``prometheus-client``: opgate exports a dozen series, several of them read from the
database at scrape time, and tests start many opgate instances in one process; the client's
process-global registry would need a registry per instance and custom collectors anyway, for
what is ~100 lines here. Label values are escaped per the format; names are constants.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    pairs = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Counter:
    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def snapshot(self) -> list[list[object]]:
        """The counts as JSON: [[label values, value], ...] (shared_metrics.py)."""
        return [[list(labels), value] for labels, value in self.values.items()]

    def empty_copy(self) -> Counter:
        return Counter(self.name, self.help, self.label_names)

    def add(self, snapshot: list[list[object]]) -> None:
        for labels, value in snapshot:
            assert isinstance(labels, list)
            assert isinstance(value, int | float)
            self.inc(*(str(v) for v in labels), amount=float(value))

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        values = self.values or ({(): 0.0} if not self.label_names else {})  # 0, not absent
        for labels, value in sorted(values.items()):
            lines.append(f"{self.name}{_labels(self.label_names, labels)} {_number(value)}")
        return lines


class Histogram:
    def __init__(
        self, name: str, help_text: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> None:
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self.buckets = (*sorted(buckets), math.inf)
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def observe(self, value: float, *labels: str) -> None:
        counts = self._counts.setdefault(labels, [0] * len(self.buckets))
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
        self._sums[labels] = self._sums.get(labels, 0.0) + value

    def snapshot(self) -> list[list[object]]:
        """The counts as JSON: [[label values, bucket counts, sum], ...] (shared_metrics.py)."""
        return [
            [list(labels), counts, self._sums[labels]] for labels, counts in self._counts.items()
        ]

    def empty_copy(self) -> Histogram:
        return Histogram(self.name, self.help, self.buckets[:-1], self.label_names)

    def add(self, snapshot: list[list[object]]) -> None:
        for labels, counts, total in snapshot:
            assert isinstance(labels, list)
            assert isinstance(counts, list)
            assert isinstance(total, int | float)
            key = tuple(str(v) for v in labels)
            mine = self._counts.setdefault(key, [0] * len(self.buckets))
            for i, count in enumerate(counts[: len(mine)]):
                mine[i] += int(count)
            self._sums[key] = self._sums.get(key, 0.0) + float(total)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for labels, counts in sorted(self._counts.items()):
            for bound, count in zip(self.buckets, counts, strict=True):
                le = f'le="{_number(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.label_names, labels, le)} {count}")
            lines.append(f"{self.name}_sum{_labels(self.label_names, labels)} {self._sums[labels]}")
            lines.append(f"{self.name}_count{_labels(self.label_names, labels)} {counts[-1]}")
        return lines


def gauge(
    name: str,
    help_text: str,
    samples: Iterable[tuple[Sequence[str], float]],
    labels: Sequence[str] = (),
) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for values, value in samples:
        lines.append(f"{name}{_labels(labels, values)} {_number(value)}")
    return lines


def exposition(blocks: Iterable[list[str]]) -> str:
    return "\n".join(line for block in blocks for line in block) + "\n"
