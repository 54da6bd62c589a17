"""The `better-compute` command line: an HTTP client of the API envelope (no Django)."""
