"""Four corpora of shapes the evaluation suite lacks, cut from text a Debian-like system ships (a reviewer's, run
once against a fixed ``paced``; BENCHMARKS.md, "Three corpora of other shapes, outside the suite").

    .venv/bin/python benchmarks/system_corpora.py OUT_DIR
    # label each as eval_corpora.py does, then (one --corpus per corpus):
    .venv/bin/python benchmarks/bench_ordering_quality.py --corpora OUT_DIR --only perl-many --timing-docs 0 \
        --corpus perl-many OUT_DIR/labels/perl-many_curated_labels.npy OUT_DIR/perl-many_token_counts.npy

- ``perl-many``: the paragraphs (split at blank lines, 20 characters or more) of every Perl module and POD file
  under /usr/share/perl, at most 25 per file: about a thousand sources of a few records each.
- ``perl-capped``: ``perl-many`` without its paragraphs over 8,000 characters (Unicode data tables).
- ``node-huge``: the Node.js API docs (/usr/share/doc/nodejs/api/all.html, tags stripped) cut into chapters at
  each <h2>, one source holding most of the tokens, then the first 200 characters of 2,500 man1 pages.
- ``vim-fixed``: Vim's help files cut into 500-character chunks: near-identical lengths.

Records are JSONL with ``text`` and ``source``, grouped by source in file order. A corpus whose files this
system lacks is skipped, said.
"""

from __future__ import annotations

import glob
import gzip
import html
import json
import os
import random
import re
import sys
from pathlib import Path


def write(out: Path, name: str, records: list[dict]) -> None:
    with (out / f"{name}.jsonl").open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(name, len(records), "records", sum(len(r["text"]) for r in records), "characters",
          len({r["source"] for r in records}), "sources", flush=True)


def perl_many() -> list[dict]:
    records = []
    files = sorted(glob.glob("/usr/share/perl/**/*.pm", recursive=True)
                   + glob.glob("/usr/share/perl/**/*.pod", recursive=True))
    for path in files:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) >= 20]
        records += [{"text": p, "source": os.path.relpath(path, "/usr/share/perl")} for p in paragraphs[:25]]
    return records


def node_huge() -> list[dict]:
    page = Path("/usr/share/doc/nodejs/api/all.html")
    if not page.is_file():
        return []
    records = []
    for part in re.split(r"(?=<h2)", page.read_text(encoding="utf-8")):
        text = re.sub(r"\n\s*\n+", "\n\n", html.unescape(re.sub(r"<[^>]+>", "", part))).strip()
        if len(text) >= 200:
            records.append({"text": text, "source": "nodejs-api"})
    pages = sorted(glob.glob("/usr/share/man/man1/*.gz"))
    random.Random(0).shuffle(pages)
    taken = 0
    for path in pages:
        try:
            text = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
        except (OSError, EOFError):
            continue
        text = "\n".join(line for line in text.splitlines() if not line.startswith(('.\\"', "'\\\"")))[:200].strip()
        if len(text) < 100:
            continue
        records.append({"text": text, "source": "man1/" + os.path.basename(path)})
        taken += 1
        if taken >= 2500:
            break
    return records


def vim_fixed() -> list[dict]:
    records = []
    for path in sorted(glob.glob("/usr/share/vim/vim*/doc/*.txt")):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        records += [{"text": text[i:i + 500], "source": os.path.basename(path)} for i in range(0, len(text) - 499, 500)]
    return records[:24000]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    perl = perl_many()
    for name, records in (("perl-many", perl), ("perl-capped", [r for r in perl if len(r["text"]) <= 8000]),
                          ("node-huge", node_huge()), ("vim-fixed", vim_fixed())):
        if records:
            write(out, name, records)
        else:
            print(f"skipping {name}: its source files are not on this system", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
