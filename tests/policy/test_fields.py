"""How `free` entries match body leaves: an array a rule leaves free covers its items."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.policy.fields import free_matcher


@pytest.mark.parametrize(
    ("entry", "leaf", "covered"),
    [
        ("/assignees", "/assignees", True),  # an empty array is one leaf
        ("/assignees", "/assignees/0", True),
        ("/assignees", "/assignees/12", True),
        ("/labels", "/labels/0/1", True),  # an array of arrays
        ("/assignees", "/assignees/01", False),  # not a canonical index
        ("/assignees", "/assignees/x", False),  # an object's key is not an item
        ("/assignees", "/assigneesx", False),
        ("/metadata/*", "/metadata/order/0", True),
        ("/metadata/*", "/metadata/order/nested", False),
    ],
)
def test_a_free_json_field_covers_the_items_of_its_array(
    entry: str, leaf: str, covered: bool
) -> None:
    """`free: [/assignees]` lets an array of any length through, item by item; the items of
    an object it holds are not covered (a free value is a leaf or a list of them)."""
    assert (free_matcher(entry, json=True).fullmatch(leaf) is not None) is covered


@given(
    indices=st.lists(st.integers(min_value=0, max_value=10**9), max_size=4),
    token=st.text(alphabet="abcxyz019", min_size=1, max_size=4),
)
def test_a_free_field_covers_exactly_canonical_indices_below_it(
    indices: list[int], token: str
) -> None:
    """Any nesting of canonical array indices below a free field is covered; a token that is
    not one (a key, a zero-padded number) is not."""
    matcher = free_matcher("/assignees", json=True)
    below = "/assignees" + "".join(f"/{i}" for i in indices)
    assert matcher.fullmatch(below) is not None
    canonical = token.isdigit() and str(int(token)) == token
    assert (matcher.fullmatch(f"{below}/{token}") is not None) is canonical
