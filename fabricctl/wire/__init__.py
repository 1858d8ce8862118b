"""The wire between the broker and everyone who talks to it: frames, flow control, the client.

`protocol` (u32 length + msgpack frames and their message Structs), `flow` (write flow
control for a frame protocol) and `client` (the one client producers, consumers, the CLI
and the TUI use). Imported alike by the server and by every client; imports only `core`
(and `errors`).
"""
