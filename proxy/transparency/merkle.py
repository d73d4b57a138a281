"""RFC 6962 (section 2.1) Merkle trees: the tree hash, audit paths, consistency proofs, and
their verifiers (the iterative algorithms of RFC 9162, section 2.1.3.2 and 2.1.4.2).

A tree is stored as its complete subtrees: the node at (``level``, ``index``) is the hash of
leaves ``[index * 2**level, (index + 1) * 2**level)``, written once when its last leaf arrives
and never changed. Every hash a proof needs is one of those nodes or a combination of them
(``range_hash``), so the producers take a ``NodeReader`` and the store fetches exactly the
positions ``inclusion_positions`` / ``consistency_positions`` name. Indexes count from 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

NodeReader = Callable[[int, int], bytes]  # (level, index) -> the complete subtree's hash
Position = tuple[int, int]


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n > 1): where RFC 6962 splits a list."""
    return 1 << ((n - 1).bit_length() - 1)


def tree_hash(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH of a list of leaves, given their leaf hashes."""
    if not leaf_hashes:
        return EMPTY_ROOT
    if len(leaf_hashes) == 1:
        return leaf_hashes[0]
    k = _split(len(leaf_hashes))
    return node_hash(tree_hash(leaf_hashes[:k]), tree_hash(leaf_hashes[k:]))


def _range_nodes(start: int, end: int) -> Iterator[Position]:
    n = end - start
    if n & (n - 1) == 0 and start % n == 0:
        yield n.bit_length() - 1, start // n
        return
    k = _split(n)
    yield from _range_nodes(start, start + k)
    yield from _range_nodes(start + k, end)


def range_hash(start: int, end: int, node: NodeReader) -> bytes:
    """MTH of leaves ``[start, end)`` (a range of RFC 6962's recursion) from stored nodes."""
    n = end - start
    if n & (n - 1) == 0 and start % n == 0:
        return node(n.bit_length() - 1, start // n)
    k = _split(n)
    return node_hash(range_hash(start, start + k, node), range_hash(start + k, end, node))


def _inclusion_ranges(index: int, start: int, end: int) -> list[Position]:
    """PATH(m, D[start:end]) as leaf ranges, bottom-up."""
    n = end - start
    if n == 1:
        return []
    k = _split(n)
    if index < k:
        return [*_inclusion_ranges(index, start, start + k), (start + k, end)]
    return [*_inclusion_ranges(index - k, start + k, end), (start, start + k)]


def _consistency_ranges(old: int, start: int, end: int, whole: bool) -> list[Position]:
    """SUBPROOF(m, D[start:end], b) as leaf ranges."""
    n = end - start
    if old == n:
        return [] if whole else [(start, end)]
    k = _split(n)
    if old <= k:
        return [*_consistency_ranges(old, start, start + k, whole), (start + k, end)]
    return [*_consistency_ranges(old - k, start + k, end, False), (start, start + k)]


def _check_index(index: int, size: int) -> None:
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")


def _check_sizes(old: int, new: int) -> None:
    if not 0 <= old <= new:
        raise ValueError(f"no consistency proof from size {old} to size {new}")


def _consistency_range_list(old: int, new: int) -> list[Position]:
    _check_sizes(old, new)
    return [] if old in (0, new) else _consistency_ranges(old, 0, new, True)


def inclusion_proof(index: int, size: int, node: NodeReader) -> list[bytes]:
    """The audit path of leaf ``index`` in the tree of ``size`` leaves."""
    _check_index(index, size)
    return [range_hash(a, b, node) for a, b in _inclusion_ranges(index, 0, size)]


def consistency_proof(old: int, new: int, node: NodeReader) -> list[bytes]:
    """The proof that the tree of ``old`` leaves is a prefix of the tree of ``new`` (empty when
    ``old`` is 0 or ``new``, as tlog-witness requires)."""
    return [range_hash(a, b, node) for a, b in _consistency_range_list(old, new)]


def inclusion_positions(index: int, size: int) -> set[Position]:
    """The stored nodes ``inclusion_proof`` reads."""
    _check_index(index, size)
    return {p for a, b in _inclusion_ranges(index, 0, size) for p in _range_nodes(a, b)}


def consistency_positions(old: int, new: int) -> set[Position]:
    """The stored nodes ``consistency_proof`` reads."""
    return {p for a, b in _consistency_range_list(old, new) for p in _range_nodes(a, b)}


def frontier_positions(size: int) -> list[Position]:
    """The complete subtrees a tree of ``size`` leaves is made of, left to right: all that
    appending needs to know of it."""
    return list(_range_nodes(0, size)) if size else []


@dataclass(frozen=True)
class Grown:
    """What appending wrote: the new complete nodes (level, index, hash) and the new root."""

    nodes: list[tuple[int, int, bytes]]
    root: bytes


def append_leaves(size: int, frontier: Sequence[bytes], leaf_hashes: Sequence[bytes]) -> Grown:
    """Append leaves to a tree of ``size`` whose frontier (``frontier_positions(size)``'s
    hashes, in order) is given."""
    positions = frontier_positions(size)
    if len(frontier) != len(positions):
        raise ValueError(f"a tree of {size} has {len(positions)} frontier nodes")
    stack = [
        (level, index, digest) for (level, index), digest in zip(positions, frontier, strict=True)
    ]
    written: list[tuple[int, int, bytes]] = []
    for offset, digest in enumerate(leaf_hashes):
        node = (0, size + offset, digest)
        written.append(node)
        while stack and stack[-1][0] == node[0]:
            level, index, left = stack.pop()
            node = (level + 1, index // 2, node_hash(left, node[2]))
            written.append(node)
        stack.append(node)
    root = EMPTY_ROOT
    if stack:
        root = stack[-1][2]
        for _, _, left in reversed(stack[:-1]):
            root = node_hash(left, root)
    return Grown(written, root)


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> bool:
    """Whether ``proof`` shows the leaf hash at ``index`` in the tree of ``size`` with
    ``root``."""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(
    old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Whether ``proof`` shows the tree of ``old`` leaves with ``old_root`` to be a prefix of
    the tree of ``new`` leaves with ``new_root``."""
    if not 0 <= old <= new:
        return False
    if old == new:
        return not proof and old_root == new_root
    if old == 0:
        return not proof
    if not proof:
        return False
    path = list(proof)
    if old & (old - 1) == 0:  # the old tree is a complete subtree: its root starts the path
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0
