"""Tenancy's API groups, one module each (imported so that they register)."""

from compute.platform.tenancy.api import system, tenants, tokens

__all__ = ["system", "tenants", "tokens"]
