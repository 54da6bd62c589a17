def test_whoami_when_root_token(root):
    me = root("system.whoami")
    assert me["tenant"] == "root"
    assert me["roles"] == [{"tenantId": me["tenantId"], "tenant": "root", "role": "admin"}]
