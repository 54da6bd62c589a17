"""The fleet's API groups, one module each (imported so that they register)."""

from fleet.api import baremetal, images, join_tokens, nodes, pki, pools, sites

__all__ = ["baremetal", "images", "join_tokens", "nodes", "pki", "pools", "sites"]
