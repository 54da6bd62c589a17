from compute.api.grants import grant

grant("member", "widgets.*")
