"""Durable shape-pure segments in LMDB: group-committed ingest, failure-atomic dispatch,
tombstones and recovery. `DurableBroker` is the entry point."""
