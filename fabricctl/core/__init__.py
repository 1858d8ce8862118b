"""Pure broker logic: no sockets, no threads, no clock (time is always an argument)."""
