"""Who may call the fleet's API methods (sites, nodes, join tokens, PKI, images)."""

from compute.core.api.grants import grant, root_only

grant("viewer", "pki.show", "nodes.events")
grant("operator", "sites.*", "nodes.*", "joinTokens.*")
root_only("sites.create")
# images.* beyond get and list: admins only
