"""Prometheus text exposition (format 0.0.4), written by hand.

Why not ``prometheus-client``: opgate exports a dozen series, several of them read from the
database at scrape time, and tests start many opgate instances in one process; the client's
process-global registry would need a registry per instance and custom collectors anyway, for
what is ~100 lines here. Label values are escaped per the format; names are constants.

The standard ``process_*`` and ``python_*`` series are written here too, with the names, types
and help texts of the official clients' collectors, so that dashboards made for any Python
exporter work. Names follow prometheus.io/docs/practices/naming (counters end in ``_total``,
base units, a limit is its own gauge, never a label value); tests/observe/test_metrics.py
checks them, with ``promtool check metrics`` where it is installed.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import resource
from collections.abc import Iterable, Sequence
from pathlib import Path

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


def _counter(name: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {_number(value)}"]


def process_metrics(proc: Path = Path("/proc/self")) -> list[list[str]]:
    """The process collector's series, read from ``/proc`` (none where there is no /proc):
    CPU time, memory, file descriptors and the start time of the process answering."""
    try:
        # the fields after the command (which may hold spaces and parentheses), from state on
        stat = (proc / "stat").read_text().rpartition(")")[2].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        open_fds = len(os.listdir(proc / "fd"))
    except (OSError, StopIteration):
        return []
    ticks = os.sysconf("SC_CLK_TCK")
    # stat(5) numbers the fields from 1 with the pid; this list starts at field 3 (state)
    utime, stime, starttime = int(stat[11]), int(stat[12]), int(stat[19])
    vsize, rss_pages = int(stat[20]), int(stat[21])
    soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return [
        _counter(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            (utime + stime) / ticks,
        ),
        gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", [((), vsize)]),
        gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            [((), rss_pages * resource.getpagesize())],
        ),
        gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            [((), boot + starttime / ticks)],
        ),
        gauge("process_open_fds", "Number of open file descriptors.", [((), open_fds)]),
        gauge(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            [((), soft_limit if soft_limit != resource.RLIM_INFINITY else math.inf)],
        ),
    ]


def python_metrics() -> list[list[str]]:
    """The interpreter's version and its garbage collector's work, per generation."""
    major, minor, patch = platform.python_version_tuple()
    info = (platform.python_implementation(), major, minor, patch, platform.python_version())
    generations = [str(g) for g in range(len(gc.get_stats()))]
    stats = list(zip(generations, gc.get_stats(), strict=True))
    return [
        gauge(
            "python_info",
            "Python platform information",
            [(info, 1)],
            ("implementation", "major", "minor", "patchlevel", "version"),
        ),
        _per_generation(
            "python_gc_objects_collected_total",
            "Objects collected during gc",
            [(g, s["collected"]) for g, s in stats],
        ),
        _per_generation(
            "python_gc_objects_uncollectable_total",
            "Uncollectable objects found during GC",
            [(g, s["uncollectable"]) for g, s in stats],
        ),
        _per_generation(
            "python_gc_collections_total",
            "Number of times this generation was collected",
            [(g, s["collections"]) for g, s in stats],
        ),
    ]


def _per_generation(name: str, help_text: str, values: list[tuple[str, int]]) -> list[str]:
    counter = Counter(name, help_text, ("generation",))
    for generation, value in values:
        counter.inc(generation, amount=value)
    return counter.render()


def exposition(blocks: Iterable[list[str]]) -> str:
    return "\n".join(line for block in blocks for line in block) + "\n"
