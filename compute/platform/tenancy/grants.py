"""Who may call tenancy's API methods (system.*, tenants.*, tokens.*)."""

from compute.core.api.grants import admin_only, grant, root_only

grant("viewer", "system.whoami")
root_only("tenants.create")
admin_only("tokens.*")  # who holds which tokens: admins only, though a list is a read
