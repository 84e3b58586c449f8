"""Checks metrics files against docs/METRICS.md and progress lines against the records.

Usage: check_metrics.py METRICS.md COMMAND JSONL PROGRESS [--want FIELD,...]
COMMAND (sim, train or run) names the "written by" column a field must list. Every record must
be a JSON object whose fields are documented for COMMAND with their type; the last record, and
only it, has an event; FIELDs must appear in some record. PROGRESS (the command's output) is
matched line by line with the record of the same round (step for train): the bytes sent and
the loss it prints must be those of the record.
"""
import json
import re
import sys


def schema(path):
    rows = {}
    for line in open(path, encoding="utf-8"):
        m = re.match(r"\| `([^`]+)` \| (\w+) \|[^|]*\|[^|]*\| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2), {w.strip() for w in m.group(3).split(",")})
    assert len(rows) > 20, f"{path}: no field table found"
    return rows


def kind_ok(kind, v):
    if v is None:  # a number measured but not finite
        return kind in ("number", "int")
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, str)


def main():
    doc, cmd, jsonl, progress = sys.argv[1:5]
    want = sys.argv[6].split(",") if len(sys.argv) > 6 and sys.argv[5] == "--want" else []
    rows = schema(doc)
    errors = []
    recs = [json.loads(l) for l in open(jsonl)]
    assert recs, f"{jsonl}: no records"
    seen = set()
    for i, r in enumerate(recs):
        assert isinstance(r, dict)
        for k, v in r.items():
            key = "rounds_<i>" if re.fullmatch(r"rounds_\d+", k) else k
            if key not in rows:
                errors.append(f"record {i}: {k} is not documented")
            elif cmd not in rows[key][1]:
                errors.append(f"record {i}: {k} is not documented as written by {cmd}")
            elif not kind_ok(rows[key][0], v):
                errors.append(f"record {i}: {k} = {v!r} is not of type {rows[key][0]}")
            seen.add(key)
        if ("event" in r) != (i == len(recs) - 1):
            errors.append(f"record {i}: event {'on a' if 'event' in r else 'missing from the'} "
                          f"{'progress' if i < len(recs) - 1 else 'last'} record")
    for k in want:
        if k not in seen:
            errors.append(f"no record has {k}")

    # Progress lines: "round R/..." (sim, run) or "step S/..." (train), with "loss L" and for
    # sim and run "sent X MB".
    by = "step" if cmd == "train" else "round"
    index = {r[by]: r for r in recs if "event" not in r and by in r}
    matched = 0
    for line in open(progress, encoding="utf-8", errors="replace"):
        m = re.search(r"\b%s (\d+)/\d+" % by, line)
        if not m:
            continue
        r = index.get(int(m.group(1)))
        if r is None:
            errors.append(f"progress line without a record: {line.strip()}")
            continue
        matched += 1
        loss = re.search(r"\bloss ([0-9.]+)", line)
        if not loss or loss.group(1) != "%.4f" % r["loss"]:
            errors.append(f"{by} {m.group(1)}: progress loss {loss and loss.group(1)}, "
                          f"record {r['loss']}")
        if cmd != "train":
            sent = re.search(r"\bsent ([0-9.]+) MB", line)
            if not sent or sent.group(1) != "%.3f" % (r["bytes_sent"] / 1e6):
                errors.append(f"{by} {m.group(1)}: progress sent {sent and sent.group(1)} MB, "
                              f"record bytes_sent {r['bytes_sent']}")
    if matched == 0:
        errors.append(f"{progress}: no progress line to compare")
    for e in errors:
        print(f"{cmd} {jsonl}: {e}")
    print(f"{cmd}: {len(recs)} records, {matched} progress lines compared, "
          f"{len(errors)} errors")
    sys.exit(1 if errors else 0)


main()
