"""The store's meta table: counters that must move in the same transactions as the data.

Contract: the persisted ledger (items and tokens received and completed), the next segment
id, the boot counter, the result sequence and each model's epoch are written only inside
the write transaction of the change they count, so after any crash they agree with the
segments and results on disk. Beside them, each model's pace (tokens per second per
consumer over its last run, `Broker.paces`) is written in the completions' commits when it
moved by more than `PACE_STEP`, and handed to the core at start (`Broker.restore_paces`):
the forecast's prior before the fleet has measured itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import lmdb

_U64 = struct.Struct(">Q")
_LEDGER = struct.Struct(">QQQQ")
_F64 = struct.Struct(">d")
PACE_STEP = 0.02  # a pace is rewritten when it moved by more than this fraction


@dataclass(slots=True)
class PersistedLedger:
    """Why: received = completed + queued must survive a crash to mean anything."""

    items_received: int = 0
    tokens_received: int = 0
    items_completed: int = 0
    tokens_completed: int = 0


@dataclass(slots=True)
class Meta:
    """Why: one place for the few counters the durable store keeps beside its segments."""

    next_seg: int = 1
    boot: int = 0
    fmt: int = 0  # the layout version (keys.FORMAT) that wrote this env; 0: none yet
    rseq: int = 0
    ledger: PersistedLedger = field(default_factory=PersistedLedger)
    epochs: dict[str, int] = field(default_factory=dict)
    paces: dict[str, float] = field(default_factory=dict)  # model -> last run's pace

    def pace_moved(self, model: str, pace: float) -> bool:
        """Whether `pace` differs from the kept one by more than `PACE_STEP`."""
        kept = self.paces.get(model)
        return kept is None or abs(pace - kept) > PACE_STEP * kept

    def keep_paces(self, paces: dict[str, float]) -> None:
        """The paces a commit wrote (those that moved) are the kept ones."""
        for model, pace in paces.items():
            if self.pace_moved(model, pace):
                self.paces[model] = pace

    def ledger_after(
        self, received: tuple[int, int] = (0, 0), completed: tuple[int, int] = (0, 0)
    ) -> PersistedLedger:
        lg = self.ledger
        return PersistedLedger(lg.items_received + received[0], lg.tokens_received + received[1],
                               lg.items_completed + completed[0],
                               lg.tokens_completed + completed[1])

    def write(
        self, txn: lmdb.Transaction, db: lmdb._Database, *, next_seg: int | None = None,
        ledger: PersistedLedger | None = None, rseq: int | None = None, boot: int | None = None,
        epoch: tuple[str, int] | None = None, fmt: int | None = None,
        pace: tuple[str, float] | None = None,
    ) -> None:
        if next_seg is not None:
            txn.put(b"next_seg", _U64.pack(next_seg), db=db)
        if ledger is not None:
            txn.put(b"ledger", _LEDGER.pack(ledger.items_received, ledger.tokens_received,
                                            ledger.items_completed, ledger.tokens_completed),
                    db=db)
        if rseq is not None:
            txn.put(b"rseq", _U64.pack(rseq), db=db)
        if boot is not None:
            txn.put(b"boot", _U64.pack(boot), db=db)
        if fmt is not None:
            txn.put(b"format", _U64.pack(fmt), db=db)
        if epoch is not None and self.epochs.get(epoch[0]) != epoch[1]:
            txn.put(b"epoch/" + epoch[0].encode(), _U64.pack(epoch[1]), db=db)
        if pace is not None and self.pace_moved(*pace):
            txn.put(b"pace/" + pace[0].encode(), _F64.pack(pace[1]), db=db)

    @classmethod
    def load(cls, txn: lmdb.Transaction, db: lmdb._Database) -> Meta:
        m = cls()
        if (v := txn.get(b"next_seg", db=db)) is not None:
            m.next_seg = _U64.unpack(v)[0]
        if (v := txn.get(b"boot", db=db)) is not None:
            m.boot = _U64.unpack(v)[0]
        if (v := txn.get(b"format", db=db)) is not None:
            m.fmt = _U64.unpack(v)[0]
        if (v := txn.get(b"rseq", db=db)) is not None:
            m.rseq = _U64.unpack(v)[0]
        if (v := txn.get(b"ledger", db=db)) is not None:
            m.ledger = PersistedLedger(*_LEDGER.unpack(v))
        cur = txn.cursor(db=db)
        if cur.set_range(b"epoch/"):
            for k, v in cur:
                if not k.startswith(b"epoch/"):  # type: ignore[union-attr]
                    break
                m.epochs[k[6:].decode()] = _U64.unpack(v)[0]  # type: ignore[union-attr]
        if cur.set_range(b"pace/"):
            for k, v in cur:
                if not k.startswith(b"pace/"):  # type: ignore[union-attr]
                    break
                m.paces[k[5:].decode()] = _F64.unpack(v)[0]  # type: ignore[union-attr]
        return m
