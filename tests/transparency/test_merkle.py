"""RFC 6962 Merkle trees (proxy/transparency/merkle.py): the tree hash, inclusion and consistency
proofs and their verifiers, against the RFC's recursive definition (hypothesis), the test
vectors of transparency-dev/merkle (``testonly/constants.go``, ``cmd/proofgen/main.go``) and
pymerkle, an implementation we did not write."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymerkle import InmemoryTree, verify_consistency, verify_inclusion

from proxy.transparency import merkle

# transparency-dev/merkle testonly.LeafInputs() and RootHashes() (tree sizes 0..8)
LEAVES = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
ROOTS = [
    bytes.fromhex(h)
    for h in (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    )
]


def h(text: str) -> bytes:
    return bytes.fromhex(text)


# cmd/proofgen's vectors: (leaf index counted from 1, tree size, audit path)
INCLUSION_VECTORS = [
    (1, 1, []),
    (
        1,
        8,
        [
            h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
        ],
    ),
    (
        6,
        8,
        [
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
            h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
    (3, 3, [h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125")]),
    (
        2,
        5,
        [
            h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        ],
    ),
]
# (old size, new size, consistency proof)
CONSISTENCY_VECTORS = [
    (1, 1, []),
    (
        1,
        8,
        [
            h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
        ],
    ),
    (
        6,
        8,
        [
            h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
    (
        2,
        5,
        [
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        ],
    ),
    (
        6,
        7,
        [
            h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            h("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
]


# The RFC's definitions, written out literally (section 2.1), as the reference the fast
# implementation is held to.
def rfc_mth(data: Sequence[bytes]) -> bytes:
    n = len(data)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + data[0]).digest()
    k = 1 << ((n - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + rfc_mth(data[:k]) + rfc_mth(data[k:])).digest()


def rfc_path(m: int, data: Sequence[bytes]) -> list[bytes]:
    n = len(data)
    if n == 1:
        return []
    k = 1 << ((n - 1).bit_length() - 1)
    if m < k:
        return [*rfc_path(m, data[:k]), rfc_mth(data[k:])]
    return [*rfc_path(m - k, data[k:]), rfc_mth(data[:k])]


def rfc_subproof(m: int, data: Sequence[bytes], whole: bool) -> list[bytes]:
    n = len(data)
    if m == n:
        return [] if whole else [rfc_mth(data)]
    k = 1 << ((n - 1).bit_length() - 1)
    if m <= k:
        return [*rfc_subproof(m, data[:k], whole), rfc_mth(data[k:])]
    return [*rfc_subproof(m - k, data[k:], False), rfc_mth(data[:k])]


class Tree:
    """A tree held in memory, as the integrator holds it in PostgreSQL: its complete nodes."""

    def __init__(self, data: Sequence[bytes]) -> None:
        self.nodes: dict[tuple[int, int], bytes] = {}
        self.size = 0
        self.frontier: list[bytes] = []
        self.root = merkle.EMPTY_ROOT
        self.append([merkle.leaf_hash(d) for d in data])

    def append(self, leaf_hashes: Sequence[bytes]) -> None:
        frontier = [self.nodes[p] for p in merkle.frontier_positions(self.size)]
        grown = merkle.append_leaves(self.size, frontier, leaf_hashes)
        for level, index, digest in grown.nodes:
            self.nodes[level, index] = digest
        self.size += len(leaf_hashes)
        self.root = grown.root

    def node(self, level: int, index: int) -> bytes:
        return self.nodes[level, index]


def test_the_empty_tree_hashes_the_empty_string() -> None:
    """MTH({}) = SHA-256() (RFC 6962 2.1; tlog-witness requires it for size 0)."""
    assert ROOTS[0] == merkle.EMPTY_ROOT
    assert merkle.tree_hash([]) == ROOTS[0]


@pytest.mark.parametrize("size", range(9))
def test_roots_match_the_rfc_6962_vectors(size: int) -> None:
    """The root of the first ``size`` test leaves is transparency-dev's, built at once or leaf by
    leaf."""
    assert merkle.tree_hash([merkle.leaf_hash(d) for d in LEAVES[:size]]) == ROOTS[size]
    tree = Tree([])
    for data in LEAVES[:size]:
        tree.append([merkle.leaf_hash(data)])
    assert tree.root == ROOTS[size]


@pytest.mark.parametrize(("leaf", "size", "path"), INCLUSION_VECTORS)
def test_inclusion_proofs_match_the_vectors(leaf: int, size: int, path: list[bytes]) -> None:
    """Each vector's audit path is what we produce, and it verifies against the vector's root."""
    tree = Tree(LEAVES[:size])
    assert merkle.inclusion_proof(leaf - 1, size, tree.node) == path
    digest = merkle.leaf_hash(LEAVES[leaf - 1])
    assert merkle.verify_inclusion(digest, leaf - 1, size, path, ROOTS[size])


@pytest.mark.parametrize(("old", "new", "proof"), CONSISTENCY_VECTORS)
def test_consistency_proofs_match_the_vectors(old: int, new: int, proof: list[bytes]) -> None:
    """Each vector's consistency proof is what we produce, and it verifies between the roots."""
    tree = Tree(LEAVES[:new])
    assert merkle.consistency_proof(old, new, tree.node) == proof
    assert merkle.verify_consistency(old, new, ROOTS[old], ROOTS[new], proof)


# distinct leaves: equal leaves have equal subtrees, so a proof may also fit another position
leaf_lists = st.lists(st.binary(max_size=8), min_size=1, max_size=70, unique=True)


@given(leaf_lists, st.data())
def test_inclusion_proofs_follow_the_rfc_and_verify_only_the_leaf(
    data: list[bytes], draw: st.DataObject
) -> None:
    """For a random tree and index: the path is RFC 6962's PATH(m, D[n]); it verifies the leaf
    against the root, and fails for any other leaf, index or root (the size is bound by the
    checkpoint that signs the root: a path's shape can fit several sizes)."""
    size = len(data)
    index = draw.draw(st.integers(0, size - 1))
    tree = Tree(data)
    root = rfc_mth(data)
    assert tree.root == root
    proof = merkle.inclusion_proof(index, size, tree.node)
    assert proof == rfc_path(index, data)
    leaf = merkle.leaf_hash(data[index])
    assert merkle.verify_inclusion(leaf, index, size, proof, root)
    for other in range(size):
        if other != index:
            assert not merkle.verify_inclusion(
                merkle.leaf_hash(data[other]), index, size, proof, root
            )
    other_index = draw.draw(st.integers(0, size))
    if other_index != index:
        assert not merkle.verify_inclusion(leaf, other_index, size, proof, root)
    assert not merkle.verify_inclusion(leaf, size, size, proof, root)
    assert not merkle.verify_inclusion(leaf, index, size, proof, merkle.leaf_hash(root))
    if proof:
        flipped = [proof[0][:-1] + bytes([proof[0][-1] ^ 1]), *proof[1:]]
        assert not merkle.verify_inclusion(leaf, index, size, flipped, root)
        assert not merkle.verify_inclusion(leaf, index, size, proof[:-1], root)
    assert not merkle.verify_inclusion(leaf, index, size, [*proof, root], root)


@given(leaf_lists, st.data())
def test_consistency_proofs_follow_the_rfc_and_verify_only_a_prefix(
    data: list[bytes], draw: st.DataObject
) -> None:
    """For random sizes m <= n: the proof is RFC 6962's PROOF(m, D[n]); it verifies the two
    roots, and fails for a tree whose first m leaves differ (a rewritten history)."""
    new = len(data)
    old = draw.draw(st.integers(1, new))
    tree = Tree(data)
    old_root, new_root = rfc_mth(data[:old]), rfc_mth(data)
    proof = merkle.consistency_proof(old, new, tree.node)
    assert proof == (rfc_subproof(old, data, True) if old < new else [])
    assert merkle.verify_consistency(old, new, old_root, new_root, proof)
    assert merkle.verify_consistency(0, new, merkle.EMPTY_ROOT, new_root, [])
    position = draw.draw(st.integers(0, old - 1))
    rewritten = [*data[:position], data[position] + b"!", *data[position + 1 :]]
    forged_old = rfc_mth(rewritten[:old])
    assert not merkle.verify_consistency(old, new, forged_old, new_root, proof)
    forged_tree = Tree(rewritten)
    forged_proof = merkle.consistency_proof(old, new, forged_tree.node)
    assert not merkle.verify_consistency(old, new, old_root, forged_tree.root, forged_proof)
    if old < new:
        assert not merkle.verify_consistency(old, new, old_root, new_root, proof[:-1])
        assert not merkle.verify_consistency(old, new, old_root, new_root, [*proof, new_root])
        assert not merkle.verify_consistency(new, old, new_root, old_root, proof)


@given(leaf_lists, st.data())
def test_a_tree_grown_in_batches_has_the_same_nodes_as_one_built_at_once(
    data: list[bytes], draw: st.DataObject
) -> None:
    """The integrator appends batch by batch; the stored nodes and root do not depend on how."""
    cut = draw.draw(st.integers(0, len(data)))
    grown = Tree(data[:cut])
    grown.append([merkle.leaf_hash(d) for d in data[cut:]])
    whole = Tree(data)
    assert grown.nodes == whole.nodes
    assert grown.root == whole.root == rfc_mth(data)


@given(leaf_lists, st.data())
def test_proofs_need_only_the_nodes_they_name(data: list[bytes], draw: st.DataObject) -> None:
    """The store fetches the positions a proof names and nothing else: the proof computed from
    those alone is the same."""
    size = len(data)
    index = draw.draw(st.integers(0, size - 1))
    old = draw.draw(st.integers(1, size))
    tree = Tree(data)
    for positions, prove in (
        (merkle.inclusion_positions(index, size), lambda n: merkle.inclusion_proof(index, size, n)),
        (merkle.consistency_positions(old, size), lambda n: merkle.consistency_proof(old, size, n)),
    ):
        subset = {p: tree.nodes[p] for p in positions}
        assert prove(lambda level, i, known=subset: known[level, i]) == prove(tree.node)


@given(st.lists(st.binary(max_size=8), min_size=1, max_size=40), st.data())
def test_an_implementation_we_did_not_write_agrees(data: list[bytes], draw: st.DataObject) -> None:
    """pymerkle (RFC 6962 hashing: sha256 with the 0x00/0x01 prefixes, leaves counted from 1)
    computes the same roots and audit paths, and accepts our proofs."""
    theirs = InmemoryTree(algorithm="sha256")
    for entry in data:
        theirs.append_entry(entry)
    ours = Tree(data)
    size = len(data)
    assert theirs.get_root() == ours.root
    index = draw.draw(st.integers(0, size - 1))
    their_proof = theirs.prove_inclusion(index + 1, size)
    # pymerkle's path starts with the leaf itself, then the RFC's audit path bottom-up
    assert their_proof.path[1:] == merkle.inclusion_proof(index, size, ours.node)
    verify_inclusion(merkle.leaf_hash(data[index]), ours.root, their_proof)
    old = draw.draw(st.integers(1, size))
    their_consistency = theirs.prove_consistency(old, size)
    verify_consistency(theirs.get_root(old), ours.root, their_consistency)
    assert theirs.get_root(old) == merkle.tree_hash([merkle.leaf_hash(d) for d in data[:old]])
