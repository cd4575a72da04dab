#!/usr/bin/env python3
"""Seeds the fuzz corpora (fuzz/corpus/<target>/, git-ignored) from the shared stream corpus.

Each target's input starts with a small header (see fuzz_targets/common/mod.rs); this prefixes
every real stream with a few headers so libFuzzer starts from realistic bodies, large and tiny
limits, and coarse and byte-sized pieces. The shared corpus is third-party data: the seeds are
written under fuzz/corpus/, which .gitignore keeps out of the repository.

Usage: fuzz/seed.py [CORPUS_DIR]   (default: $TOKENMETER_CORPUS or <repo>/../shared/corpus)
"""

import csv
import os
import sys
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
MAX = 16 * 1024  # libFuzzer mutates short inputs faster; the head of a stream has every shape.

# Must match the tables in fuzz_targets/extractors.rs and fuzz_targets/tap.rs.
EXTRACTOR_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/api/chat",
                   "/api/generate", "/generate", "/generate_stream", "/v1/responses",
                   "/v1beta/models/m:streamGenerateContent", "/v1/embeddings", "/v2/chat",
                   "/completion", "/v2/models/ensemble/generate_stream",
                   "/ml/v1/generation/text_stream", "/v1/streams/abc", "/"]
TAP_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/api/chat",
             "/api/generate", "/generate_stream", "/v1/embeddings", "/"]
# (limit index, max-piece index): 4096-byte and 16-byte limits; 64-byte and 1-byte pieces.
HEADERS = [(8, 5), (5, 0), (9, 7)]


def path_index(table, endpoint):
    path = endpoint.split(" ")[-1].split("?")[0]
    if "://" in path:
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    for i, p in enumerate(table):
        if p != "/" and (path.endswith(p) or p.split("/")[-1].split(":")[-1] in path):
            return i
    return len(table) - 1


def sse_messages(body):
    """Event data as the decoder would give it, good enough for seeds."""
    out, event, data = [], b"", []
    for line in body.replace(b"\r\n", b"\n").split(b"\n"):
        if not line:
            if data:
                out.append((event, b"\n".join(data)))
            event, data = b"", []
        elif line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
        elif line.startswith(b"event:"):
            event = line[6:].strip()
    if data:
        out.append((event, b"\n".join(data)))
    return out


def main():
    default = os.environ.get("TOKENMETER_CORPUS") or FUZZ.parent.parent / "shared" / "corpus"
    corpus = Path(sys.argv[1] if len(sys.argv) > 1 else default)
    manifest = corpus / "MANIFEST.tsv"
    if not manifest.exists():
        sys.exit(f"seed.py: no corpus at {corpus}")
    dirs = {t: FUZZ / "corpus" / t for t in ["sse", "ndjson", "extractors", "tap", "inject"]}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(manifest, newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            body = (corpus / row["path"]).read_bytes()[:MAX]
            name = row["path"].replace("/", "_")
            ndjson = row["path"].endswith(".ndjson")
            for k, (limit, piece) in enumerate(HEADERS):
                head = bytes([limit, piece, k, 0])
                (dirs["ndjson" if ndjson else "sse"] / f"{name}.{k}").write_bytes(head + body)
                ct = 3 if ndjson else 0
                tap = head + bytes([ct, path_index(TAP_PATHS, row["endpoint"]), 0, 0])
                (dirs["tap"] / f"{name}.{k}").write_bytes(tap + body)
                if not ndjson:
                    (dirs["inject"] / f"{name}.{k}").write_bytes(head + b"\0" + body)
            if ndjson:
                msgs = [(b"", line) for line in body.split(b"\n") if line.strip()]
                kind = 1
            else:
                msgs = sse_messages(body)
                kind = 0
            pick = kind * 16 + path_index(EXTRACTOR_PATHS, row["endpoint"])
            joined = b"\0".join(e + b"\x1f" + d if e else d for e, d in msgs)
            (dirs["extractors"] / name).write_bytes(bytes([pick]) + joined)
            n += 1
    print(f"seeded {n} streams into {FUZZ / 'corpus'}")


if __name__ == "__main__":
    main()
