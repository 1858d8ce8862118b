"""The OpenAI Batch API of `fabricctl up --api HOST:PORT`: files and batches over HTTP.

Contract: the package serves OpenAI's `/v1/files` and `/v1/batches` (`app`) with their
object shapes (`objects`), streams uploads to disk with bounded memory and checks their lines
as they arrive (`upload`), keeps uploads in their own small LMDB (`fabricctl.store.files`),
and drives each batch as a job of the broker through the wire client, a producer like
`submit` (`backend`, `batches`, `service`). `address` checks where it may listen. It
imports core, formats, wire, producer, the files store, config and errors; nothing imports
it but the daemon (`daemon.serve`) and `up`'s check of its address.
"""
