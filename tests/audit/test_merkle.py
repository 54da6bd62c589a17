"""RFC 6962 tree hashes and proofs against the certificate-transparency test vectors."""

import hashlib
import random

import pytest

from bcd.contract.merkle import (
    EMPTY_ROOT,
    Frontier,
    consistency_ranges,
    hash_ranges,
    inclusion_ranges,
    leaf_hash,
    resolve,
    tree_hash,
    verify_consistency,
    verify_inclusion,
)

LEAVES = [b"", b"\x00", b"\x10", b"\x20\x21", b"\x30\x31", b"\x40\x41\x42\x43",
          b"\x50\x51\x52\x53\x54\x55\x56\x57",
          b"\x60\x61\x62\x63\x64\x65\x66\x67\x68\x69\x6a\x6b\x6c\x6d\x6e\x6f"]
ROOTS = ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
         "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
         "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
         "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
         "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
         "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
         "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
         "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"]
INCLUSION = {
    (0, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (5, 8): ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
    (0, 1): [],
}
CONSISTENCY = {
    (1, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (6, 8): ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
    (2, 5): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"],
}
HASHES = [leaf_hash(leaf) for leaf in LEAVES]


def proof(ranges, hashes):
    return resolve(ranges, lambda wanted: hash_ranges(enumerate(hashes), wanted))


def test_empty_tree_is_sha256_of_nothing():
    assert hashlib.sha256(b"").digest() == EMPTY_ROOT
    assert tree_hash([]) == EMPTY_ROOT


@pytest.mark.parametrize("size", range(1, 9))
def test_tree_hash_vectors(size):
    assert tree_hash(HASHES[:size]).hex() == ROOTS[size - 1]


@pytest.mark.parametrize(("index", "size"), sorted(INCLUSION))
def test_inclusion_proof_vectors(index, size):
    path = proof(inclusion_ranges(index, size), HASHES[:size])
    assert [h.hex() for h in path] == INCLUSION[(index, size)]
    assert verify_inclusion(HASHES[index], index, size, path, bytes.fromhex(ROOTS[size - 1]))


@pytest.mark.parametrize(("old", "new"), sorted(CONSISTENCY))
def test_consistency_proof_vectors(old, new):
    nodes = proof(consistency_ranges(old, new), HASHES[:new])
    assert [h.hex() for h in nodes] == CONSISTENCY[(old, new)]
    assert verify_consistency(old, new, nodes, bytes.fromhex(ROOTS[old - 1]),
                              bytes.fromhex(ROOTS[new - 1]))


def test_every_proof_up_to_64_leaves_verifies_and_tampering_fails():
    hashes = [leaf_hash(str(i).encode()) for i in range(64)]
    for size in range(1, 65):
        root = tree_hash(hashes[:size])
        for index in range(size):
            path = proof(inclusion_ranges(index, size), hashes[:size])
            assert verify_inclusion(hashes[index], index, size, path, root)
            assert not verify_inclusion(hashes[index - 1] if index else hashes[1], index, size,
                                        path, root) or size == 1
        for old in range(1, size + 1):
            nodes = proof(consistency_ranges(old, size), hashes[:size])
            old_root = tree_hash(hashes[:old])
            assert verify_consistency(old, size, nodes, old_root, root)
            if old < size:
                assert not verify_consistency(old, size, nodes, root, root)


def test_frontier_resumes_where_it_stopped():
    hashes = [leaf_hash(random.randbytes(8)) for _ in range(1000)]
    frontier = Frontier()
    frontier.extend(hashes[:377])
    resumed = Frontier(frontier.size, list(frontier.peaks))
    resumed.extend(hashes[377:])
    assert resumed.root() == tree_hash(hashes)
    assert [end - start for start, end in resumed.peak_ranges()] == [512, 256, 128, 64, 32, 8]


def test_consistency_nodes_inside_the_old_tree_are_its_frontier_peaks():
    for new in range(2, 65):
        for old in range(1, new):
            peaks = set(_peaks_of(old))
            inside = {r for r in consistency_ranges(old, new) if r[1] <= old}
            assert inside <= peaks, (old, new, inside - peaks)
            assert all(r[0] >= old or r[1] <= old for r in consistency_ranges(old, new))


def _peaks_of(size):
    frontier = Frontier()
    frontier.extend(leaf_hash(bytes([i % 256])) for i in range(size))
    return frontier.peak_ranges()
