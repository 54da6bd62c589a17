"""bcd, the node agent. A plain Python package: it never imports Django or the control plane."""
