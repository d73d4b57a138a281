"""AP2 v0.2 Checkout Mandates read as the checkout a payment is bound to. Pure: a verified
presentation (``chain``) in, a ``CheckoutBinding`` or a refusal out.

Field names are AP2's (``docs/ap2/checkout_mandate.md``, ``code/sdk/schemas/ap2/
checkout_mandate.json``, ``open_checkout_mandate.json``): ``vct`` ``mandate.checkout.1``
(closed) with ``checkout_jwt`` (the merchant-signed checkout) and ``checkout_hash`` (its
base64url SHA-256); ``mandate.checkout.open.1`` (open) with ``constraints`` and ``cnf``. The
constraints defined there are evaluated against the checkout's payload, a UCP Checkout
(``merchant``, ``line_items[].item.id``, ``line_items[].quantity``):

- ``checkout.allowed_merchants``: the checkout's ``merchant`` is one of the revealed
  ``allowed`` (an entry matches when every field it names is the merchant's);
- ``checkout.line_items``: AP2's maximal flow, each requirement's ``quantity`` of its revealed
  ``acceptable_items`` and nothing else in the checkout;
- any other type fails ("Any unknown Constraints MUST be treated as failing evaluation").

The merchant's signature on ``checkout_jwt`` is the merchant's to check (opgate holds no
merchant keys): its payload is read only as far as the person's (or agent's) signature over
``checkout_hash`` binds it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from proxy.mandates.ap2 import (
    CheckoutBinding,
    MandateCode,
    MandateRefusal,
    failed,
    unchanged,
)
from proxy.mandates.chain import VerifiedMandate
from proxy.mandates.sdjwt import SdJwtInvalid, b64url_digest, b64url_json

CHECKOUT = "mandate.checkout.1"
CHECKOUT_OPEN = "mandate.checkout.open.1"
# Bounds on what the line-item flow walks; a checkout past them is refused, not evaluated
MAX_LINE_ITEMS = 256
MAX_QUANTITY = 10_000


def checkout_of(mandate: VerifiedMandate) -> CheckoutBinding | MandateRefusal:
    """The binding of a closed Checkout Mandate, or of the agent's closed one within the
    person's open Checkout Mandate (its constraints met)."""
    vct = mandate.root.get("vct")
    if mandate.closed is None:
        if vct != CHECKOUT:
            return MandateRefusal(MandateCode.INVALID, f"the checkout's vct is not {CHECKOUT}")
        return _closed(mandate.root, None)
    if vct != CHECKOUT_OPEN:
        return MandateRefusal(
            MandateCode.INVALID, f"the delegating checkout's vct is not {CHECKOUT_OPEN}"
        )
    closed = mandate.closed
    if closed.get("vct") != CHECKOUT:
        return MandateRefusal(MandateCode.INVALID, f"the agent's checkout's vct is not {CHECKOUT}")
    changed = unchanged(mandate.root, closed)
    if changed is not None:
        return changed
    binding = _closed(closed, mandate.root_reference)
    if isinstance(binding, MandateRefusal):
        return binding
    payload = _checkout_payload(closed["checkout_jwt"])
    if payload is None:
        return MandateRefusal(MandateCode.INVALID, "checkout_jwt's payload is not a JSON object")
    refusal = _evaluate_constraints(mandate.root, payload)
    return binding if refusal is None else refusal


def _closed(
    content: dict[str, Any], open_reference: str | None
) -> CheckoutBinding | MandateRefusal:
    jwt, claimed = content.get("checkout_jwt"), content.get("checkout_hash")
    if not isinstance(jwt, str) or jwt.count(".") != 2 or not jwt.isascii():
        return MandateRefusal(MandateCode.INVALID, "checkout_jwt is not disclosed as a JWT")
    if not isinstance(claimed, str) or claimed != b64url_digest(jwt):
        return MandateRefusal(
            MandateCode.MISMATCH,
            "checkout_hash is not the hash of the checkout_jwt presented",
            field="checkout_hash",
        )
    return CheckoutBinding(checkout_hash=claimed, open_reference=open_reference)


def _checkout_payload(jwt: str) -> dict[str, Any] | None:
    try:
        payload = b64url_json(jwt.split(".")[1], "checkout_jwt's payload")
    except SdJwtInvalid:
        return None
    return payload if isinstance(payload, dict) else None


def _evaluate_constraints(
    open_content: dict[str, Any], payload: dict[str, Any]
) -> MandateRefusal | None:
    constraints = open_content.get("constraints", [])
    if not isinstance(constraints, list):
        return MandateRefusal(MandateCode.INVALID, "constraints is not an array")
    for constraint in constraints:
        kind = constraint.get("type") if isinstance(constraint, dict) else None
        if not isinstance(kind, str):
            return MandateRefusal(MandateCode.INVALID, "a constraint has no type")
        if kind == "checkout.allowed_merchants":
            if not _merchant_allowed(payload.get("merchant"), constraint.get("allowed")):
                return failed(kind, "the checkout's merchant is not one the person allowed")
        elif kind == "checkout.line_items":
            if not _line_items_met(constraint.get("items"), payload.get("line_items")):
                return failed(kind, "the checkout's line items are not the ones allowed")
        else:
            return failed("unknown", "a constraint opgate cannot evaluate (AP2: it fails)")
    return None


def _merchant_allowed(merchant: object, allowed: object) -> bool:
    """AP2: the merchant "MUST be present in the revealed elements of allowed"; none revealed
    fails."""
    if not isinstance(merchant, dict) or not isinstance(allowed, list):
        return False
    return any(
        isinstance(entry, dict) and entry and all(merchant.get(k) == v for k, v in entry.items())
        for entry in allowed
    )


def _quantity(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_QUANTITY:
        return value
    return None


def _line_items_met(requirements: object, line_items: object) -> bool:
    """AP2's evaluation as a maximal flow: source -> each requirement (its quantity) -> each
    checkout item id among its revealed acceptable_items (unbounded) -> sink (the checkout's
    total quantity of that id). Met when the flow equals both the requirements' total and the
    checkout's total: every requirement filled, every item in the checkout used."""
    if not isinstance(requirements, list) or not requirements:
        return False
    if not isinstance(line_items, list) or not 0 < len(line_items) <= MAX_LINE_ITEMS:
        return False
    wanted: list[tuple[int, set[str]]] = []
    for requirement in requirements[:MAX_LINE_ITEMS]:
        if not isinstance(requirement, dict):
            return False
        quantity = _quantity(requirement.get("quantity"))
        acceptable = requirement.get("acceptable_items")
        if quantity is None or not isinstance(acceptable, list):
            return False
        ids = {a["id"] for a in acceptable if isinstance(a, dict) and isinstance(a.get("id"), str)}
        wanted.append((quantity, ids))
    if len(wanted) != len(requirements):
        return False
    in_checkout: dict[str, int] = {}
    for line in line_items:
        item = line.get("item") if isinstance(line, dict) else None
        quantity = _quantity(line.get("quantity")) if isinstance(line, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or quantity is None:
            return False
        in_checkout[item["id"]] = in_checkout.get(item["id"], 0) + quantity
    required, bought = sum(q for q, _ in wanted), sum(in_checkout.values())
    return required == bought and _max_flow(wanted, in_checkout) == required


def _max_flow(wanted: list[tuple[int, set[str]]], in_checkout: dict[str, int]) -> int:
    """Edmonds-Karp over the bipartite graph above (breadth-first augmenting paths)."""
    ids = sorted(in_checkout)
    source, sink = 0, 1 + len(wanted) + len(ids)
    requirement_node = {i: 1 + i for i in range(len(wanted))}
    item_node = {item: 1 + len(wanted) + j for j, item in enumerate(ids)}
    unbounded = sum(in_checkout.values())  # no edge can carry more than the whole checkout
    capacity: dict[int, dict[int, int]] = {n: {} for n in range(sink + 1)}

    def edge(a: int, b: int, c: int) -> None:
        capacity[a][b] = capacity[a].get(b, 0) + c
        capacity[b].setdefault(a, 0)

    for i, (quantity, acceptable) in enumerate(wanted):
        edge(source, requirement_node[i], quantity)
        for item in acceptable & in_checkout.keys():
            edge(requirement_node[i], item_node[item], unbounded)
    for item, quantity in in_checkout.items():
        edge(item_node[item], sink, quantity)
    flow = 0
    while True:
        previous: dict[int, int] = {source: source}
        queue = deque([source])
        while queue and sink not in previous:
            node = queue.popleft()
            for nxt, left in capacity[node].items():
                if left > 0 and nxt not in previous:
                    previous[nxt] = node
                    queue.append(nxt)
        if sink not in previous:
            return flow
        path, node = [], sink
        while node != source:
            path.append((previous[node], node))
            node = previous[node]
        pushed = min(capacity[a][b] for a, b in path)
        for a, b in path:
            capacity[a][b] -= pushed
            capacity[b][a] += pushed
        flow += pushed
