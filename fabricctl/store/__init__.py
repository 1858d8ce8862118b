"""Durable shape-pure segments in LMDB: group-committed ingest, failure-atomic dispatch,
results that mark entries completed, and recovery. `DurableBroker` is the entry point."""
