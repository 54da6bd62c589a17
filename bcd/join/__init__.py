"""`bcd join`, in two parts: `documents` is the join's cryptography and documents (pins,
the sealed token and CSR, checking the signed answer), with no I/O; `client` talks to the
control plane (the well-known document, the Join RPC) and writes what a join leaves."""
