"""Producer formats: JSONL input lines in, result lines out.

Contract: `fabricctl.formats.reader` is the entry point (a streaming reader that never raises for
bad input); the modules here hold one concern each: `common` (the draft every input format
parses into, the `Source` of a line and the field checks), `native` and `openai_batch` (one
input format each), `tokens` (token counting), `results` (what the broker keeps per item
and the two output forms) and `workload` (a synthetic multi-shape producer).
"""
