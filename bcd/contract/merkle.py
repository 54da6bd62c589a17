"""RFC 6962 Merkle trees: tree hashes, inclusion and consistency proofs, and their checks.

Pure and dependency-free, so the control plane, the CLI's offline verifier and agents share
one implementation. Leaves are hashed as SHA-256(0x00 || data), nodes as
SHA-256(0x01 || left || right); the tree over n leaves splits at the largest power of two
smaller than n.

`Frontier` is the compact form of a tree: the roots of its perfect subtrees from left to
right. Appending a leaf costs O(log n) and the frontier alone yields the root, so a new
checkpoint over k new leaves costs O(k), whatever the log's size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def split_point(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


@dataclass
class Frontier:
    """The perfect-subtree roots of a tree of `size` leaves, largest (leftmost) first."""

    size: int = 0
    peaks: list[bytes] = field(default_factory=list)

    def append(self, leaf: bytes) -> None:
        """Add one leaf *hash*."""
        node, size = leaf, self.size
        while size & 1:
            node = node_hash(self.peaks.pop(), node)
            size >>= 1
        self.peaks.append(node)
        self.size += 1

    def extend(self, leaves: Iterable[bytes]) -> None:
        for leaf in leaves:
            self.append(leaf)

    def root(self) -> bytes:
        if not self.peaks:
            return EMPTY_ROOT
        node = self.peaks[-1]
        for peak in reversed(self.peaks[:-1]):
            node = node_hash(peak, node)
        return node

    def peak_ranges(self) -> list[tuple[int, int]]:
        """(start, end) of each peak: the binary digits of `size`, high to low."""
        ranges, start = [], 0
        for bit in reversed(range(self.size.bit_length())):
            if self.size >> bit & 1:
                ranges.append((start, start + (1 << bit)))
                start += 1 << bit
        return ranges


def tree_hash(leaves: Iterable[bytes]) -> bytes:
    """MTH over leaf hashes."""
    frontier = Frontier()
    frontier.extend(leaves)
    return frontier.root()


def inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """The leaf ranges whose tree hashes form PATH(index, D[size]), bottom-up."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")
    ranges: list[tuple[int, int]] = []
    start, end = 0, size
    while end - start > 1:
        k = split_point(end - start)
        if index - start < k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
    return list(reversed(ranges))


def consistency_ranges(old: int, new: int) -> list[tuple[int, int]]:
    """The leaf ranges whose tree hashes form PROOF(old, D[new]) (RFC 6962 2.1.2)."""
    if not 0 < old <= new:
        raise ValueError(f"no consistency proof from {old} to {new}")

    def sub(m: int, start: int, end: int, complete: bool) -> list[tuple[int, int]]:
        n = end - start
        if m == n:
            return [] if complete else [(start, end)]
        k = split_point(n)
        if m <= k:
            return [*sub(m, start, start + k, complete), (start + k, end)]
        return [*sub(m - k, start + k, end, False), (start, start + k)]

    return sub(old, 0, new, True)


def resolve(ranges: list[tuple[int, int]],
            range_hash: Callable[[list[tuple[int, int]]], dict[tuple[int, int], bytes]]
            ) -> list[bytes]:
    """Turn ranges into hashes with `range_hash`, which computes many ranges in one pass."""
    hashes = range_hash(sorted(set(ranges)))
    return [hashes[r] for r in ranges]


def hash_ranges(leaves: Iterable[tuple[int, bytes]],
                ranges: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
    """Tree hashes of disjoint sorted ranges, from (position, leaf hash) in position order."""
    out: dict[tuple[int, int], bytes] = {}
    pending = list(ranges)
    current: Frontier | None = None
    for position, leaf in leaves:
        while pending and position >= pending[0][1]:
            pending.pop(0)
        if not pending:
            break
        start, end = pending[0]
        if position < start:
            continue
        if current is None:
            current = Frontier()
        current.append(leaf)
        if position == end - 1:
            out[(start, end)] = current.root()
            current = None
            pending.pop(0)
    missing = [r for r in ranges if r not in out]
    if missing:
        raise ValueError(f"leaves missing for ranges {missing[:3]}")
    return out


def verify_inclusion(leaf: bytes, index: int, size: int, path: list[bytes],
                     root: bytes) -> bool:
    """RFC 9162 2.1.3.2: does `path` lead from leaf hash `leaf` at `index` to `root`?"""
    if not 0 <= index < size:
        return False
    fn, sn, node = index, size - 1, leaf
    for sibling in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            node = node_hash(sibling, node)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            node = node_hash(node, sibling)
        fn >>= 1
        sn >>= 1
    return sn == 0 and node == root


def verify_consistency(old: int, new: int, proof: list[bytes], old_root: bytes,
                       new_root: bytes) -> bool:
    """RFC 9162 2.1.4.2: is the tree of `new` leaves an append-only extension of `old`?"""
    if old == new:
        return not proof and old_root == new_root
    if not 0 < old < new or not proof:
        return False
    if old & (old - 1) == 0:  # a power of two: the old root is the first node
        proof = [old_root, *proof]
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = proof[0]
    for node in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(node, fr)
            sr = node_hash(node, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, node)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root
