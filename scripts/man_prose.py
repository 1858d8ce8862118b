"""The hand-written parts of fabricctl's man pages, as roff, keyed by command path.

Contract: `gen_man.py` takes NAME/SYNOPSIS/DESCRIPTION/OPTIONS/COMMANDS from the Typer app
and everything here verbatim: `exit_status(key)` (the shared table plus what a command
adds), `ENVIRONMENT` (fabricctl's own variables made from `fabricctl.config.ENV_VARS`, the
one list of them, then the others it honours), `FILES`, `EXAMPLES[key]` as (what, command
line) pairs (escaped by the generator), `DESCRIPTION[key]` (an extra roff paragraph) and
`see_also(page, pages)`. Keys are command paths without the program name: "" (fabricctl
itself), "submit", "shapes list".
Text here is already roff: write `\\-` for a minus sign and `\\fB...\\fR` for bold.
"""

from __future__ import annotations

import re

from fabricctl.config import ENV_VARS, VllmSettings, key_docs
from fabricctl.wire.protocol import SOCKET_NAME

_CODES = [
    ("0", "Success."),
    ("1", "Runtime error: a refused input line, a broker error, a failed check."),
    ("2", "Usage or configuration error (bad flag, unknown config key, invalid TOML)."),
    ("3", "Backend missing: no broker answers on the data dir's socket, or no engine."),
    ("4", "Timeout: a wait ran out."),
    ("5", "Engine failed: an inference server could not run or answer a request."),
    ("6", "Launch failed: an inference server could not be made ready."),
    ("130", "Interrupted (Ctrl\\-C)."),
]

_SPECIFIC = {
    "submit": "\\fBsubmit\\fR exits 0 when every line was accepted, 1 when any line was "
    "refused (each is reported on stderr; the others still went in), 3 when no broker runs "
    "and 4 when \\fB\\-\\-timeout\\fR expired before every result arrived.",
    "jobs priority": "\\fBjobs priority\\fR exits 2 when N is not a whole number from 0 to "
    "1000000 (nothing is sent), 1 when no job matches ID or the job has ended.",
    "results": "\\fBresults \\-\\-follow\\fR runs until interrupted and then exits 130.",
    "shapes inspect": "\\fBshapes inspect\\fR exits 1 when no shape matches.",
    "doctor": "\\fBdoctor\\fR exits 0 when no check failed (warnings allowed), else 1.",
    "down": "\\fBdown\\fR exits 3 when no broker runs, 4 when it still runs 30 s after "
    "being asked to stop.",
    "up": "\\fBup\\fR exits 0 after a clean stop (\\fBfabricctl down\\fR), 130 after "
    "SIGINT or SIGTERM, 3 when it has no engine to start (no GPU found) and 6 when vLLM did "
    "not become ready.",
    "calibrate": "\\fBcalibrate\\fR exits 3 when the server does not answer and 5 when it "
    "answers with something other than a completion or has no \\fBvllm:cache_config_info\\fR "
    "metric.",
    "replay": "\\fBreplay\\fR exits 2 on a bad flag, and when the workload, the jobs file or "
    "the costs file does not read (or the workload has no readable item).",
}


def exit_status(key: str) -> str:
    lines = []
    if key in _SPECIFIC:
        lines += [_SPECIFIC[key], ".PP", "All fabricctl commands use these codes:"]
    for code, meaning in _CODES:
        lines += [".TP", f"\\fB{code}\\fR", meaning]
    lines += [".PP", "Errors are one line on stderr, \\fBfabricctl: error:\\fR followed by the "
              "reason; data goes to stdout only. When the reader of stdout goes away "
              "(\\fB| head\\fR) fabricctl stops quietly."]
    return "\n".join(lines)


def _roff(text: str) -> str:
    """Plain text as roff: backslashes and minus signs escaped, `code` spans bold."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"`([^`]*)`", r"\\fB\1\\fR", text)


ENVIRONMENT = "".join(f"\n.TP\n.B {v.name}\n{_roff(v.doc)}" for v in ENV_VARS) + r"""
.TP
.BR XDG_CONFIG_HOME ", " XDG_DATA_HOME
Where the user configuration and the default data dir live
(\fI~/.config\fR and \fI~/.local/share\fR when unset).
.TP
.B NO_COLOR
When set, tables and messages carry no colour. Without a terminal there is none anyway.
.PP
Precedence of settings: command\-line flag, then environment, then the project file
\fI./fabric.toml\fR, then the user file, then the defaults.
"""

FILES = rf"""
.TP
.I $XDG_CONFIG_HOME/fabricctl/config.toml
User configuration (TOML); \fBfabricctl config default\fR prints every key.
.TP
.I ./fabric.toml
Project configuration, read from the working directory.
.TP
.I DATA_DIR/{SOCKET_NAME}
The broker's Unix socket; every client command connects to it.
.TP
.I DATA_DIR/fabric.lmdb
The durable store: queued items in shape\-pure segments, results, the ledger.
.TP
.I DATA_DIR/broker.lock
Held by the running broker; one broker per data dir.
"""

DESCRIPTION = {
    "": r"""Commands that read the broker (\fBstatus\fR, \fBshapes\fR, \fBresults\fR,
\fBtop\fR, \fBdoctor\fR) take \fB\-\-json\fR and print one JSON document;
\fBsubmit \-\-wait\fR and \fBresults\fR print JSON Lines.""",
    "submit": r"""Input lines are native items
(\fB{"id", "model", "prefix": [...], "prompt", "max_tokens"}\fR)
or OpenAI batch requests (\fB{"custom_id", "method", "url", "body"}\fR), mixed freely;
results come back in the form their line came in, native or OpenAI batch output.
A bad \fB\-\-priority\fR or \fB\-\-window\fR is exit 2 before any line is sent.
.PP
Endpoints: an OpenAI line's \fBurl\fR is one of \fB/v1/completions\fR,
\fB/v1/chat/completions\fR, \fB/v1/embeddings\fR, \fB/v1/score\fR (or \fB/score\fR),
\fB/v1/rerank\fR (or \fB/rerank\fR, \fB/v2/rerank\fR), \fB/v1/responses\fR and
\fB/v1/audio/transcriptions\fR (any other is a line error listing them); its body goes to
vLLM as written (a transcription's \fBfile_url\fR downloaded and sent as multipart). A
native line names one in \fB"endpoint"\fR (\fBembeddings\fR, \fBscore\fR,
\fBrerank\fR, \fBresponses\fR, \fBtranscriptions\fR) with the
request body in \fB"params"\fR and no \fBprompt\fR, \fBmessages\fR or \fBmax_tokens\fR.
The shape per endpoint: chat and responses, the messages (or \fBinstructions\fR and input
items) before the last; embeddings, the first line of an \fBinput\fR string that starts
with \fBInstruct:\fR (or a declared \fBprefix\fR); score and rerank, the query, shared by
its documents. Native results of these endpoints carry vLLM's answer whole in
\fB"response"\fR (the vectors or scores); OpenAI output lines carry it as the body. An
engine 4xx (an unsupported \fBdimensions\fR, a model without the endpoint: "Model does not
support endpoint") is that line's error; the rest completes.""",
    "up": r"""With \fB\-\-api\fR, \fBPOST /v1/batches\fR takes OpenAI's
\fBcompletion_window\fR (\fB<N>h\fR, \fB<N>m\fR or \fB<N>s\fR: the job's deadline)
and, in its \fBmetadata\fR, a fabricctl extension: \fB"priority": "N"\fR (a string, as
every metadata value; a whole number from 0 to 1000000, higher first) sets the job's
priority; any other value is a 400 with param \fBmetadata.priority\fR. The Batch object
keeps its metadata as given.""",
    "config": "The \\fB[vllm]\\fR section says which vLLM to launch and how:"
    + "".join(f"\n.TP\n.B vllm.{k}\n{_roff(d)}" for k, d in key_docs(VllmSettings).items()),
}

EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "": [
        ("Start a broker on simulated GPUs, feed it, watch it, stop it:",
         "fabricctl up --engine sim &\n"
         "until fabricctl status > /dev/null 2>&1; do sleep 0.5; done   # until it answers\n"
         "python examples/produce.py --items 1000 | fabricctl submit - --wait > results.jsonl\n"
         "fabricctl status\nfabricctl down"),
    ],
    "up": [
        ("Two GPUs with one vLLM server each, as configured in a file:",
         "fabricctl up --config examples/fabric.toml"),
        ("A second broker next to the first, on simulated GPUs:",
         "fabricctl up --data-dir /tmp/fabric-b --engine sim"),
    ],
    "run": [
        ("An OpenAI batch file through an embedded broker, results to a file:",
         "fabricctl run examples/openai_batch.jsonl -o out.jsonl"),
    ],
    "table": [
        ("Label every product of a CSV; the answers come back as a column of a CSV:",
         "fabricctl table examples/products.csv --key sku \\\n"
         "    -i \"Is this product waterproof? Answer yes, no or unsure.\" \\\n"
         "    --question \"Answer:\" --max-tokens 4 --explain -o labelled.csv"),
        ("The lines alone, submitted to a running broker:",
         "fabricctl table examples/products.csv --key sku -i \"Summarise the product.\" --emit \\\n"
         "    | fabricctl submit - --wait > results.jsonl"),
    ],
    "consume": [
        ("Serve a remote broker from this host's vLLM server:",
         "fabricctl consume --broker gpu-head:7070 --engine openai \\\n"
         "    --endpoint http://127.0.0.1:8001 --gpu 0"),
    ],
    "replay": [
        ("Would grouping by shape pay on two GPUs whose caches hold half the prefixes?",
         "fabricctl replay prompts.jsonl --gpus 2 --pressure 2 --model /models/llama"),
    ],
    "calibrate": [
        ("Fit the replay's costs to a running server, then rehearse on it:",
         "fabricctl calibrate -e http://127.0.0.1:8001 --max-num-seqs 256 -o costs.toml\n"
         "fabricctl replay prompts.jsonl --costs costs.toml --gpus 1 --model /models/llama"),
    ],
    "submit": [
        ("Submit a workload and keep only the results' ids and cache hits:",
         "python examples/produce.py --items 1000 | fabricctl submit - --wait \\\n"
         "    | jq -c '{id, shape, cached: .usage.cached_tokens}'"),
        ("Submit a file without waiting; count the refused lines:",
         "fabricctl submit prompts.jsonl 2> refused.txt; wc -l refused.txt"),
        ("Give up after ten minutes of waiting for results:",
         "fabricctl submit prompts.jsonl --wait --timeout 600 > out.jsonl"),
        ("An urgent job that must be done within two hours:",
         "fabricctl submit urgent.jsonl --priority 10 --window 2h"),
    ],
    "jobs priority": [
        ("Put a running job ahead of the others:",
         "fabricctl jobs priority batch_1f 100"),
    ],
    "results": [
        ("Every result stored so far, then new ones as they come:",
         "fabricctl results --follow | jq -r .id"),
        ("Resume from where the last run stopped:",
         "next=$(fabricctl results --json | jq .next)\n"
         "fabricctl results --since \"$next\""),
    ],
    "shapes": [
        ("The shapes with the most queued tokens:",
         "fabricctl shapes list --json | jq -r '.shapes | sort_by(-.tokens)[] | .shape'"),
    ],
    "shapes list": [
        ("Live shapes as tab-separated values:", "fabricctl shapes list | column -t"),
    ],
    "shapes inspect": [
        ("One shape by label, then its lanes as JSON:",
         "fabricctl shapes inspect acme-support\n"
         "fabricctl shapes inspect acme-support --json | jq '.lanes'"),
    ],
    "status": [
        ("Check that the ledger balances (prints [0,0]):",
         "fabricctl status --json | jq -c .difference"),
    ],
    "doctor": [
        ("The failed checks only:",
         "fabricctl doctor --json | jq -r '.checks[] | select(.status == \"fail\") | .detail'"),
    ],
    "down": [("Stop the broker of a data dir:", "fabricctl down --data-dir /tmp/fabric-b")],
    "top": [
        ("The dashboard, refreshed twice a second:", "fabricctl top --interval 0.5"),
        ("One snapshot as JSON, for scripts:", "fabricctl top --once --json | jq .ledger"),
    ],
    "config": [
        ("Start a user configuration from the defaults:",
         "mkdir -p ~/.config/fabricctl\n"
         "fabricctl config default > ~/.config/fabricctl/config.toml"),
    ],
    "config show": [
        ("Where the data dir setting comes from:", "fabricctl config show | grep ^data_dir"),
    ],
    "config default": [
        ("Every default, as TOML:", "fabricctl config default"),
    ],
}


def see_also(page: str, pages: list[str]) -> str:
    """The other fabricctl pages, then the tools the examples use."""
    refs = [f"\\fB{p.replace('-', chr(92) + '-')}\\fR(1)" for p in pages if p != page]
    refs += ["\\fBnvidia\\-smi\\fR(1)", "\\fBjq\\fR(1)"]
    return ",\n".join(refs)
