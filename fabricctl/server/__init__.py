"""The broker daemon: one socket protocol for producers, consumers and observers."""
