"""GET /metrics over HTTP: the process and Python collectors, the pool's limit as its own gauge,
and every name by Prometheus's conventions (promtool's lint where Debian's prometheus package
provides it, and the naming rules written out here either way)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field

import pytest

from proxy.observe.metrics import CONTENT_TYPE
from tests.support.opgate import Opgate

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# Units that are not the base unit Prometheus asks for (seconds, bytes, ratios not percent).
_NOT_BASE_UNITS = ("_ms", "_milliseconds", "_microseconds", "_minutes", "_hours", "_kb", "_mb")
_NOT_BASE_UNITS += ("_kilobytes", "_megabytes", "_percent")
# Label values that are not a dimension but another quantity mixed into the series.
_QUANTITIES_AS_LABELS = {"max", "min", "limit", "total", "capacity"}


@dataclass
class Family:
    kind: str = ""
    help: str = ""
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


def families(text: str) -> dict[str, Family]:
    """The exposition parsed by family: TYPE, HELP and samples (suffixes folded in)."""
    found: dict[str, Family] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line[7:].split(" ", 1)
            found.setdefault(name, Family()).kind = kind
        elif line.startswith("# HELP "):
            name, help_text = line[7:].split(" ", 1)
            found.setdefault(name, Family()).help = help_text
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match is not None, line
            name, labels, value = match.groups()
            family = name
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and name.removesuffix(suffix) in found:
                    family = name.removesuffix(suffix)
            found.setdefault(family, Family()).samples.append(
                (name, dict(_LABEL.findall(labels or "")), float(value))
            )
    return found


def naming_problems(found: dict[str, Family]) -> list[str]:
    """Prometheus's naming rules (prometheus.io/docs/practices/naming): snake_case names with
    an application prefix; counters, and only counters, end in _total; base units; a label
    value is a dimension, never a limit or another quantity."""
    problems = []
    for name, family in found.items():
        if not re.fullmatch(r"(opgate|process|python)_[a-z0-9_]+", name):
            problems.append(f"{name}: not a snake_case name with its prefix")
        if not family.kind or not family.help:
            problems.append(f"{name}: no TYPE or no HELP")
        if (family.kind == "counter") != name.endswith("_total"):
            problems.append(f"{name}: a {family.kind}: only counters end in _total, and all do")
        if any(unit in name for unit in _NOT_BASE_UNITS):
            problems.append(f"{name}: not in base units (seconds, bytes)")
        for _, labels, _ in family.samples:
            mixed = _QUANTITIES_AS_LABELS & set(labels.values())
            if mixed:
                problems.append(
                    f"{name}: label value {sorted(mixed)} is a quantity, not a dimension"
                )
    return problems


async def scrape(gate: Opgate) -> str:
    async with gate.http.get(f"{gate.ops_url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == CONTENT_TYPE
        return await response.text()


async def test_metrics_carry_the_process_and_python_collectors(fault_gate: Opgate) -> None:
    """The standard process_* series (CPU, memory, file descriptors, start time) and python_*
    (version, garbage collection) describe the process that answered the scrape."""
    found = families(await scrape(fault_gate))
    for name, kind in [
        ("process_cpu_seconds_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
        ("python_info", "gauge"),
        ("python_gc_objects_collected_total", "counter"),
        ("python_gc_objects_uncollectable_total", "counter"),
        ("python_gc_collections_total", "counter"),
    ]:
        assert found[name].kind == kind, name
    [(_, _, open_fds)] = found["process_open_fds"].samples
    [(_, _, max_fds)] = found["process_max_fds"].samples
    assert 0 < open_fds < max_fds
    [(_, _, started)] = found["process_start_time_seconds"].samples
    assert time.time() - 3600 < started <= time.time()
    [(_, _, resident)] = found["process_resident_memory_bytes"].samples
    assert resident > 10 * 2**20
    [(_, labels, one)] = found["python_info"].samples
    assert one == 1
    assert labels["implementation"] == "CPython"
    generations = {
        labels["generation"] for _, labels, _ in found["python_gc_collections_total"].samples
    }
    assert generations == {"0", "1", "2"}


async def test_the_pool_limit_is_its_own_gauge(fault_gate: Opgate) -> None:
    """Pool connections by state are in use and idle only; the pool's limit is a separate
    gauge, so sum(opgate_db_pool_connections) is the connections open."""
    found = families(await scrape(fault_gate))
    states = {labels["state"] for _, labels, _ in found["opgate_db_pool_connections"].samples}
    assert states == {"in_use", "idle"}
    [(_, _, limit)] = found["opgate_db_pool_max_connections"].samples
    assert limit == fault_gate.running.gateway.settings.pool_max_size


async def test_every_metric_name_follows_the_naming_rules(fault_gate: Opgate) -> None:
    """Counters end in _total and only they do, units are base units, no label value is a
    limit or another quantity, every family has TYPE and HELP."""
    await fault_gate.approve()  # some operation and request series to check, not only zeros
    assert naming_problems(families(await scrape(fault_gate))) == []


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (Debian: prometheus)")
async def test_promtool_finds_nothing_to_lint(fault_gate: Opgate) -> None:
    """`promtool check metrics`, Prometheus's own linter, accepts the whole exposition."""
    text = await scrape(fault_gate)
    done = await asyncio.to_thread(
        subprocess.run,
        ["promtool", "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
