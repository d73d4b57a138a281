"""Rule path patterns and canonical request paths (proxy/policy/paths.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.policy.paths import PathPattern, Segment, is_canonical_path


def test_parse_splits_literals_and_parameters() -> None:
    """A pattern parses into literal, parameter and rest segments in order."""
    pattern = PathPattern.parse("/v1/charges/{charge}/capture")
    assert pattern.segments == (
        Segment(literal="v1"),
        Segment(literal="charges"),
        Segment(param="charge"),
        Segment(literal="capture"),
    )
    assert pattern.param_names == ("charge",)
    assert PathPattern.parse("/v1/{resource...}").segments[-1] == Segment(
        param="resource", rest=True
    )


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("/", id="root only"),
        pytest.param("v1/refunds", id="no leading slash"),
        pytest.param("/v1/", id="trailing slash"),
        pytest.param("/v1//refunds", id="empty segment"),
        pytest.param("/v1/{id}/{id}", id="parameter named twice"),
        pytest.param("/v1/{rest...}/x", id="rest not last"),
        pytest.param("/v1/{Id}", id="uppercase parameter"),
        pytest.param("/v1/{1d}", id="parameter starting with a digit"),
        pytest.param("/v1/{}", id="unnamed parameter"),
        pytest.param("/v1/{id", id="unclosed brace"),
        pytest.param("/v1/x{id}", id="parameter inside a literal"),
        pytest.param("/v1/a%2Fb", id="percent escape"),
        pytest.param("/v1/a b", id="space"),
        pytest.param("/v1/caf\u00e9", id="non-ASCII"),
        pytest.param("/v1/../x", id="dot-dot literal"),
        pytest.param("/v1/./x", id="dot literal"),
    ],
)
def test_parse_rejects_bad_patterns(text: str) -> None:
    """A pattern that is not '/'-led literal or {name} segments is a ValueError."""
    with pytest.raises(ValueError, match="path"):
        PathPattern.parse(text)


MATCHES: list[tuple[str, str, str, dict[str, str] | None]] = [
    ("literal", "/v1/refunds", "/v1/refunds", {}),
    ("literal differs", "/v1/refunds", "/v1/charges", None),
    ("literal is case-sensitive", "/v1/refunds", "/v1/Refunds", None),
    ("parameter", "/v1/charges/{charge}/capture", "/v1/charges/ch_1/capture", {"charge": "ch_1"}),
    ("too short", "/v1/charges/{charge}/capture", "/v1/charges/ch_1", None),
    ("too long", "/v1/charges/{charge}", "/v1/charges/ch_1/capture", None),
    ("parameter takes one segment", "/v1/charges/{charge}", "/v1/charges/a/b", None),
    ("rest takes one segment", "/v1/{rest...}", "/v1/charges", {"rest": "charges"}),
    (
        "rest takes many",
        "/v1/{rest...}",
        "/v1/charges/ch_1/refunds",
        {"rest": "charges/ch_1/refunds"},
    ),
    ("rest needs at least one", "/v1/{rest...}", "/v1", None),
    ("rest after parameter", "/a/{x}/{rest...}", "/a/1/2/3", {"x": "1", "rest": "2/3"}),
    ("prefix differs before rest", "/v1/{rest...}", "/v2/charges", None),
]


@pytest.mark.parametrize(
    ("pattern", "path", "expected"), [pytest.param(*case[1:], id=case[0]) for case in MATCHES]
)
def test_match(pattern: str, path: str, expected: dict[str, str] | None) -> None:
    """A canonical path matches a pattern segment by segment, yielding its parameters."""
    assert PathPattern.parse(pattern).match(path) == expected


def test_render() -> None:
    """Rendering fills parameters into the pattern, a rest parameter across segments."""
    assert PathPattern.parse("/v1/charges/{charge}/capture").render({"charge": "ch_1"}) == (
        "/v1/charges/ch_1/capture"
    )
    assert PathPattern.parse("/v1/{rest...}").render({"rest": "a/b"}) == "/v1/a/b"
    assert PathPattern.parse("/v1/refunds").render({}) == "/v1/refunds"


@pytest.mark.parametrize(
    ("pattern", "params"),
    [
        pytest.param("/v1/charges/{charge}", {}, id="missing"),
        pytest.param("/v1/charges/{charge}", {"charge": "a", "x": "b"}, id="unexpected"),
        pytest.param("/v1/refunds", {"x": "b"}, id="unexpected on a literal pattern"),
        pytest.param("/v1/charges/{charge}", {"charge": ""}, id="empty"),
        pytest.param("/v1/charges/{charge}", {"charge": "a/b"}, id="slash in a single segment"),
        pytest.param("/v1/charges/{charge}", {"charge": "a%2Fb"}, id="percent escape"),
        pytest.param("/v1/charges/{charge}", {"charge": "a b"}, id="space"),
        pytest.param("/v1/charges/{charge}", {"charge": "a?b"}, id="query mark"),
        pytest.param("/v1/charges/{charge}", {"charge": "a#b"}, id="fragment mark"),
        pytest.param("/v1/charges/{charge}", {"charge": "\u00e9"}, id="non-ASCII"),
        pytest.param("/v1/charges/{charge}", {"charge": ".."}, id="dot-dot"),
        pytest.param("/v1/charges/{charge}", {"charge": "."}, id="dot"),
        pytest.param("/v1/{rest...}", {"rest": "a//b"}, id="rest with empty segment"),
        pytest.param("/v1/{rest...}", {"rest": "a/"}, id="rest with trailing slash"),
        pytest.param("/v1/{rest...}", {"rest": "a/../b"}, id="rest with dot-dot"),
    ],
)
def test_render_rejects_bad_params(pattern: str, params: dict[str, str]) -> None:
    """A missing, extra or non-canonical parameter cannot be rendered into a path."""
    with pytest.raises(ValueError, match="path"):
        PathPattern.parse(pattern).render(params)


CANONICAL: list[tuple[str, str, bool]] = [
    ("plain", "/v1/refunds", True),
    ("provider id characters", "/v1/x:y@z!$'()*+,;=~-_.", True),
    ("single dot inside a segment", "/v1/a.b", True),
    ("empty", "", False),
    ("root", "/", False),
    ("relative", "v1/refunds", False),
    ("trailing slash", "/v1/refunds/", False),
    ("double slash", "/v1//refunds", False),
    ("leading double slash", "//v1/refunds", False),
    ("dot-dot", "/v1/../admin", False),
    ("dot", "/v1/./refunds", False),
    ("final dot-dot", "/v1/..", False),
    ("escaped slash", "/v1/a%2Fb", False),
    ("escaped dot", "/v1/%2e%2e/admin", False),
    ("backslash", "/v1\\..\\admin", False),
    ("query", "/v1/refunds?x=1", False),
    ("fragment", "/v1/refunds#x", False),
    ("space", "/v1/a b", False),
    ("non-ASCII", "/v1/caf\u00e9", False),
    ("NUL", "/v1/a\x00", False),
]


@pytest.mark.parametrize(
    ("path", "canonical"), [pytest.param(*case[1:], id=case[0]) for case in CANONICAL]
)
def test_is_canonical_path(path: str, canonical: bool) -> None:
    """Only '/'-led paths of plain segments (no escapes, dot or empty segments) are canonical."""
    assert is_canonical_path(path) is canonical


# --- properties --------------------------------------------------------------------------------

SEGMENT_CHARS = "ABCXYZabcxyz0189_.~:@!$'()*+,;=-"
literal = st.text("abcxyz0189_.~-", min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))
value = st.text(SEGMENT_CHARS, min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))
names = st.lists(
    st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True), unique=True, min_size=0, max_size=4
)


@st.composite
def patterns_with_params(draw: st.DrawFn) -> tuple[PathPattern, dict[str, str]]:
    """A random pattern (literals, parameters, maybe a final rest) and values for it."""
    params = draw(names)
    rest = bool(params) and draw(st.booleans())
    parts: list[str] = []
    values: dict[str, str] = {}
    for index, name in enumerate(params):
        parts.extend(draw(st.lists(literal, max_size=2)))
        if rest and index == len(params) - 1:
            parts.append("{" + name + "...}")
            values[name] = "/".join(draw(st.lists(value, min_size=1, max_size=3)))
        else:
            parts.append("{" + name + "}")
            values[name] = draw(value)
    if not rest:
        parts.extend(draw(st.lists(literal, min_size=0 if parts else 1, max_size=2)))
    return PathPattern.parse("/" + "/".join(parts)), values


@given(patterns_with_params())
def test_render_then_match_round_trips(case: tuple[PathPattern, dict[str, str]]) -> None:
    """A rendered path is canonical and matches its own pattern with the same parameters."""
    pattern, params = case
    path = pattern.render(params)
    assert is_canonical_path(path)
    assert pattern.match(path) == params


@given(st.text(max_size=30))
def test_canonical_paths_have_only_plain_segments(path: str) -> None:
    """Whatever is_canonical_path accepts splits into non-empty, non-dot, unescaped segments."""
    if is_canonical_path(path):
        segments = path[1:].split("/")
        assert all(s and s not in (".", "..") and "%" not in s for s in segments)
        assert path.isascii()
