"""What the agent and the control plane share: ids, enums and wire messages."""
