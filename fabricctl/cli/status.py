"""`fabricctl status`: how a running broker stands.

Contract: the `status` command (`command`) finds the broker as every client command does
(`--data-dir` > `FABRICCTL_DATA_DIR` > config); no broker: exit 3.
- `--json` (`show_status`): one document, the broker's `status` answer (`version`, `ledger`,
  `difference`, `states`, `models`, `counters`, `extra` with `store`, `engine`, `gpus`,
  `processes`, `uptime_s`, `servers`: each launched vLLM server's `ServerView`; `unserved`:
  `{model, items, tokens}` per model with queued items and no consumer; `jobs`: the live jobs with
  counts and `endpoints`; `mix`: `{"jobs": N, "endpoints": {name: items}}`) with `consumers` the
  list of registered consumers (each one's `current` and `next` shape a hex signature or null,
  `shapes_hex`), and `token_counter` added: `choose_counter`'s name ("estimate",
  "tokenizer:<path>", "error: ..." when the tokenizer does not load) for a `submit` or `run` with
  this configuration (`submit_counter`: producers count tokens, the broker counts none).
- Without `--json` (`render_status`), Rich tables: the ledger and its difference (which must read
  0); under it one line per unserved model (`waiting_lines`: `N items wait for model 'X': no
  consumer`) and per vLLM server not ready (`server_lines`: starting, restarting, or failed with
  reason, last exit and log); the live jobs' endpoint mix (`mix_lines`, absent with no live job);
  shape states; consumers with their current and next shape; store usage; the last recovery; every
  host's GPUs (`hosts_table`: the broker's and the agents', with consumer, engine, NVML
  utilisation and memory or "simulated", tokens, KV hit rate; `NO_LOCAL_GPUS` for `up --gpus
  none`) and the token counter. Figures through `fabricctl.fmt`, "n/a" for one not reported.
- On a terminal the consumers' and GPUs' tables fit its width (`common.fitted_table`: names,
  signatures and item counts never cut) and a key-value table's value wraps; through a pipe the
  same tables at their natural width (`common.console`), no line cut or folded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from fabricctl.cli.support import ConfigFile, DataDir, JsonOut, guarded, settings
from fabricctl.config import AppConfig
from fabricctl.core.colocate import shared_note
from fabricctl.core.signature import signature_hex
from fabricctl.core.unserved import Waiting, waiting_line
from fabricctl.fmt import age, gib, human_bytes, pct
from fabricctl.formats.tokens import choose_counter
from fabricctl.wire.client import Client

from .common import PIPE_WIDTH, Col, call, console, fitted_table, write_json
from .jobmix import fleet_line

NO_LOCAL_GPUS = "no local GPUs: waiting for agents"  # what `up --gpus none` reports

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text


def command(json_out: bool = JsonOut, data_dir: Path | None = DataDir,
            config: Path | None = ConfigFile) -> None:
    """Show the broker's ledger, shape states, consumers, store usage and last recovery.

    A model with queued items and no consumer is one line: "N items wait for model 'X': no
    consumer" (--json: unserved).

    Also the token counter a `fabricctl submit` with this configuration counts input
    tokens with ("estimate" or "tokenizer:PATH"; --json: token_counter): producers count
    tokens, the broker does not.
    """
    cfg = settings(data_dir, config)
    guarded(lambda: show_status(cfg, json_out))


def fetch_status(cfg: AppConfig) -> dict[str, Any]:
    async def fetch(c: Client) -> dict[str, Any]:
        status = await c.status()
        status["consumers"] = [shapes_hex(msgspec.to_builtins(v))
                               for v in await c.consumers()]
        return status

    status = call(cfg, "observer", fetch)
    status["token_counter"] = submit_counter(cfg)
    return status


def served_names(consumer: dict[str, Any]) -> str:
    """`tiny`, or for a server answering several names `tiny +ad-a +ad-b (now ad-a)`."""
    names = consumer.get("names") or []
    if not names:
        return str(consumer["model"])
    now = consumer.get("serving") or consumer["model"]
    return " ".join([consumer["model"], *(f"+{n}" for n in names)]) + f" (now {now})"


def shapes_hex(consumer: dict[str, Any]) -> dict[str, Any]:
    """The consumer view with its current and next shape as hex signatures (None stays)."""
    for k in ("current", "next"):
        v = consumer.get(k)
        consumer[k] = signature_hex(v) if isinstance(v, int) else None
    return consumer


def submit_counter(cfg: AppConfig) -> str:
    """The name of the token counter `fabricctl submit` uses with this configuration."""
    try:
        return choose_counter(cfg.producer.tokenizer, cfg.model).name
    except Exception as e:  # a configured tokenizer that does not load: submit fails too
        return f"error: {e}"


def _kv(title: str, rows: list[tuple[str, str]]) -> Table:
    """A titled two-column table; a value too wide for the terminal wraps, never cut, and
    the table is at least as wide as its title (which would wrap at the table's width)."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=Text(title), title_justify="left", show_header=False,
              min_width=len(title))
    t.add_column("what")
    t.add_column("value", justify="right", overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    return t


# The consumers' and GPUs' tables on a terminal: names, signatures and the items done are
# never cut; the other figures are hidden when they do not fit, the highest `drop` first.
CONSUMER_COLUMNS = [
    Col("NAME"), Col("MODEL", shrink=12), Col("SHAPE"), Col("NEXT", drop=1),
    Col("BATCH", True, drop=6), Col("TOKENS/BATCH", True, drop=5),
    Col("IN FLIGHT", True, drop=4), Col("BATCHES", True, drop=3), Col("ITEMS", True)]
GPU_COLUMNS = [
    Col("HOST"), Col("GPU", True), Col("CONSUMER"), Col("ENGINE", drop=4),
    Col("UTIL", True, drop=2), Col("MEMORY", True, drop=3), Col("TOKENS", True, drop=1),
    Col("KV HIT", True)]


def render_status(st: dict[str, Any], data_dir: str, width: int = PIPE_WIDTH
                  ) -> list[Table | Text]:
    """The status as Rich renderables for a console `width` columns wide."""
    from rich.text import Text

    led, diff = st["ledger"], st["difference"]
    extra = st.get("extra", {})
    engine = extra.get("engine", {})
    ok = "ok" if list(diff) == [0, 0] else "NOT ZERO"
    out: list[Table | Text] = []
    out.append(_kv(f"broker {st['version']} at {data_dir} — up {age(extra.get('uptime_s'))}, "
               f"engine {engine.get('kind', '?')}", [
        ("received", f"{led['items_received']:,} items, {led['tokens_received']:,} tokens"),
        ("queued", f"{led['items_queued']:,} items, {led['tokens_queued']:,} tokens"),
        ("in flight", f"{led['items_inflight']:,} items, {led['tokens_inflight']:,} tokens"),
        ("completed", f"{led['items_completed']:,} items, {led['tokens_completed']:,} tokens"),
        ("ledger difference", f"{diff[0]} items, {diff[1]} tokens ({ok})"),
    ]))
    out.extend(waiting_lines(st))
    out.extend(server_lines(extra))
    out.extend(shared_lines(extra))
    out.extend(mix_lines(st))
    out.append(_kv("shapes", [(k + (" (since start)" if k == "finished" else ""), f"{v:,}")
                              for k, v in st["states"].items()]))
    ct = fitted_table(
        CONSUMER_COLUMNS,
        [[c["name"], served_names(c), c.get("current") or "-", c.get("next") or "-",
          str(c["max_batch_size"]), f"{c['max_batch_tokens']:,}", str(c["batches_inflight"]),
          f"{c['batches_done']:,}", f"{c['items_done']:,}"] for c in st["consumers"]],
        width, " (see status --json)", title=Text(f"consumers ({len(st['consumers'])})"),
        title_justify="left")
    out.append(ct)
    store = extra.get("store", {})
    if store:
        used, size = store.get("used_bytes"), store.get("map_size")
        rec = store.get("recovery", {})
        out.append(_kv("store", [
            ("LMDB used", f"{human_bytes(used)} of {human_bytes(size)} map "
                          f"({pct(used / size if used is not None and size else None)})"),
            ("free disk", human_bytes(store.get("free_disk"))),
            ("results stored", f"{store.get('results', 0):,}"),
            ("last recovery", f"boot {rec.get('boot', '?')}: {rec.get('items', 0):,} items, "
                              f"{rec.get('tokens', 0):,} tokens in {rec.get('seconds', 0)} s, "
                              f"ledger {'ok' if rec.get('ledger_ok', True) else 'NOT ok'}"),
        ]))
    gpus = extra.get("gpus")
    if engine.get("kind") == "none":
        out.append(_kv("host", [("GPUs", str(engine.get("reason") or NO_LOCAL_GPUS))]))
    elif isinstance(gpus, dict):
        line = (f"{len(gpus.get('gpus', []))} GPU(s)" if gpus.get("available")
                else gpus.get("reason") or "NVML unavailable")
        out.append(_kv("host", [("GPUs", line)]))
    by_host = hosts_table(extra, width)
    if by_host is not None:
        out.append(by_host)
    if "token_counter" in st:
        out.append(_kv("producers", [("token counts (fabricctl submit, this config)",
                                      st["token_counter"])]))
    return out


def server_lines(extra: dict[str, Any]) -> list[Text]:
    """One line per launched server that is not ready: `engine 1 (gpu 1, model emb) failed:
    <reason>; exit 1; log <path>` (a failed one in bold red)."""
    from rich.text import Text

    out = []
    servers = extra.get("servers")
    for v in servers if isinstance(servers, list) else ():
        if not isinstance(v, dict) or v.get("state") == "ready":
            continue
        line = f"engine {v.get('index')} (gpu {v.get('gpus')}, model {v.get('model')}) " \
               f"{v.get('state')}"
        if v.get("reason"):
            line += f": {v['reason']}"
        if v.get("last_exit") is not None:
            line += f"; exit {v['last_exit']}"
        if str(v.get("log")) not in line:
            line += f"; log {v.get('log')}"
        out.append(Text(line, style="bold red" if v.get("state") == "failed" else "bold"))
    return out


def shared_lines(extra: dict[str, Any]) -> list[Text]:
    """One line per consumer whose server it shares with live traffic: its last reading
    (`core.colocate.shared_note`), bold while the batch is paused."""
    from rich.text import Text

    out = []
    for _, _, name, eng, _ in gpu_rows(extra):
        stats = eng.get("stats")
        shared = stats.get("shared") if isinstance(stats, dict) else None
        if isinstance(shared, dict):
            note = shared_note(**shared)
            out.append(Text(f"{name}: {note}", style="bold" if shared["window"] == 0 else ""))
    return out


def waiting_lines(st: dict[str, Any]) -> list[Text]:
    """One warning line per model with queued items and no consumer (`core.unserved`)."""
    from rich.text import Text

    return [Text(waiting_line(Waiting(w["model"], w["items"], w["tokens"])), style="bold")
            for w in st.get("unserved", [])]


def mix_lines(st: dict[str, Any]) -> list[Text]:
    """The live jobs' endpoint mix, one line (none without a live job)."""
    from rich.text import Text

    live = st.get("mix") or {}
    if not live.get("jobs"):
        return []
    line = Text("endpoints of the live jobs: ", style="bold")
    line.append(fleet_line(live.get("endpoints") or {}, int(live["jobs"])))
    return [line]


def gpu_rows(extra: dict[str, Any]) -> list[tuple[str, int | None, str, dict[str, Any],
                                                  dict[str, Any] | None]]:
    """(host, gpu, consumer, its engine entry, the GPU's NVML sample or None) per consumer,
    sorted by host then GPU: an agent's sample comes with its heartbeats, the broker host's
    from the broker's own NVML report."""
    here = str(extra.get("host") or "")
    report = extra.get("gpus")
    local = {g.get("index"): g for g in (report.get("gpus") or [])} \
        if isinstance(report, dict) and report.get("available") else {}
    engines = extra.get("engines")
    rows = []
    for name, eng in (engines.items() if isinstance(engines, dict) else ()):
        host = str(eng.get("host") or here or "?")
        gpu = eng.get("gpu")
        sample = eng.get("nvml")
        if not isinstance(sample, dict):
            sample = local.get(gpu) if host == here else None
        rows.append((host, gpu, name, eng, sample))
    rows.sort(key=lambda r: (r[0] != here, r[0], -1 if r[1] is None else r[1], r[2]))
    return rows


def hosts_table(extra: dict[str, Any], width: int = PIPE_WIDTH) -> Table | None:
    """Every host's GPUs (the broker's and the agents'), grouped by host, fitted to
    `width` columns; None without any."""
    from rich.text import Text

    rows = gpu_rows(extra)
    if not rows:
        return None
    hosts = {r[0] for r in rows}
    cells: list[list[str]] = []
    last = None
    for host, gpu, name, eng, sample in rows:
        raw = eng.get("stats")
        stats: dict[str, Any] = raw if isinstance(raw, dict) else {}
        util = sample.get("utilization_gpu") if sample else None
        mem = (f"{gib(sample.get('memory_used'))}/{gib(sample.get('memory_total'))} GiB"
               if sample else ("simulated" if eng.get("simulated") else "no NVML"))
        tokens = int(stats.get("prompt_tokens", 0) or 0) + int(
            stats.get("generation_tokens", 0) or 0)
        q = stats.get("prefix_cache_queries") or 0
        cells.append([host if host != last else "", "-" if gpu is None else str(gpu), name,
                      str(eng.get("engine") or "?"), "n/a" if util is None else f"{util}%",
                      mem, f"{tokens:,}",
                      pct((stats.get("prefix_cache_hits") or 0) / q if q else None)])
        last = host
    title = (f"GPUs by host ({len(hosts)} host{'s' if len(hosts) > 1 else ''}, "
             f"{len(rows)} GPU{'s' if len(rows) > 1 else ''})")
    return fitted_table(GPU_COLUMNS, cells, width, " (see status --json)", title=Text(title),
                        title_justify="left")


def show_status(cfg: AppConfig, as_json: bool) -> None:
    st = fetch_status(cfg)
    if as_json:
        write_json(st)
        return
    con = console()
    for table in render_status(st, str(cfg.data_dir), con.width):
        con.print(table)
