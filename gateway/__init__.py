"""The gateway: a standalone gRPC server holding node sessions over mTLS."""
