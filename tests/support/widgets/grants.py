from compute.core.api.grants import grant

grant("member", "widgets.*")
