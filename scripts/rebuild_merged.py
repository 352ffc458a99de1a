"""Rebuild a merged run folder whose records.jsonl.gz holds more than one copy of a (drafter, dataset, prompt,
repeat) key: keep, for every prompt, the copy of the part that the merged manifest says contributes it.

    python scripts/rebuild_merged.py FOLDER [FOLDER ...]

Until issue 14, ``merge_runs`` kept every part's records of every prompt that any part contributed, so a part's
records of left-out datasets or incomplete chunks stayed beside the owning part's copy (the manifest counted them
as left out). The parts themselves are not committed, but the merged folder says enough to tell the copies apart:

* ``manifest["prompts"]`` is the concatenation of what each part contributed, in part order, and
  ``parts[i]["prompts"]`` is how many; so each prompt's owning part is known;
* the old merge wrote the parts' records one part after the other, each part's records whole except those of
  prompts no part contributed; ``parts[i]["records_left_out"]`` counted part i's records of prompts it did not
  contribute, so part i wrote ``prompts * drafters * repeats + records_left_out`` records. Where these add up to the
  number of lines (nothing was dropped), they cut the file into the parts' segments, and the owning copy of a
  record is the one in its owner's segment. The script checks that every kept record's ``index`` is the one the
  manifest gives its prompt, that exactly one copy per key is kept, and that no key is missing.

It then rewrites records.jsonl.gz and summary.json (``metrics.summarize``); manifest.json gets a ``rebuilt`` entry.
A folder without duplicated keys is left as it is.
"""

from __future__ import annotations

import gzip
import itertools
import json
import sys
from pathlib import Path

from dspark_bench.metrics import summarize
from dspark_bench.results import (
    MANIFEST,
    RECORDS,
    SUMMARY,
    read_manifest,
    read_records,
    record_from_dict,
    write_json,
)


def owners(manifest: dict) -> dict[tuple[str, str], tuple[int, int]]:
    """(dataset, prompt id) -> (index of the contributing part, the prompt's index in that part)."""
    out, start = {}, 0
    for n, part in enumerate(manifest["parts"]):
        for p in manifest["prompts"][start:start + part["prompts"]]:
            out[(p["dataset"], p["prompt_id"])] = (n, p["index"])
        start += part["prompts"]
    if start != len(manifest["prompts"]):
        raise SystemExit(f"the parts contribute {start} prompts, the manifest lists {len(manifest['prompts'])}")
    return out


def owned_lines(manifest: dict, rows: list[dict]) -> list[dict]:
    """The rows of the owning parts, in file order."""
    args = manifest["args"]
    per_prompt = len(args["drafters"]) * int(args.get("repeats") or 1)
    own = owners(manifest)
    lengths = [p["prompts"] * per_prompt + p["records_left_out"] for p in manifest["parts"]]
    if sum(lengths) != len(rows):
        raise SystemExit(f"the parts wrote {sum(lengths)} records by their counts, the file holds {len(rows)}: "
                         f"the segments cannot be told apart")
    bounds = list(itertools.accumulate([0, *lengths]))
    kept = [row for n, (lo, hi) in enumerate(itertools.pairwise(bounds)) for row in rows[lo:hi]
            if own[(row["dataset"], row["prompt_id"])][0] == n]
    for row in kept:
        if row["index"] != own[(row["dataset"], row["prompt_id"])][1]:
            raise SystemExit(f"{row['prompt_id']}: the kept copy has index {row['index']}, the manifest "
                             f"{own[(row['dataset'], row['prompt_id'])][1]}")
    keys = {(r["drafter"], r["dataset"], r["prompt_id"], r["repeat"]) for r in kept}
    if not len(keys) == len(kept) == len(own) * per_prompt:
        raise SystemExit(f"kept {len(kept)} records with {len(keys)} keys; expected {len(own) * per_prompt}")
    return kept


def rebuild(folder: Path) -> None:
    manifest = read_manifest(folder)
    packed = folder / (RECORDS + ".gz")
    rows = [json.loads(line) for line in gzip.decompress(packed.read_bytes()).decode().splitlines() if line.strip()]
    if len({(r["drafter"], r["dataset"], r["prompt_id"], r["repeat"]) for r in rows}) == len(rows):
        print(f"{folder}: no duplicated key, left as it is")
        return
    kept = owned_lines(manifest, rows)
    packed.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in kept).encode(), mtime=0))
    records = read_records(folder)
    assert records == [record_from_dict(r) for r in kept]
    write_json(folder / SUMMARY, summarize(records, int(manifest["args"]["block_size"])))
    manifest["rebuilt"] = {"by": "scripts/rebuild_merged.py (issue 14)", "records_before": len(rows),
                           "records_after": len(kept),
                           "note": "kept each prompt's records of the part that contributes it only"}
    write_json(folder / MANIFEST, manifest)
    print(f"{folder}: {len(rows)} records -> {len(kept)}")


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    for folder in argv:
        rebuild(Path(folder))


if __name__ == "__main__":
    main(sys.argv[1:])
