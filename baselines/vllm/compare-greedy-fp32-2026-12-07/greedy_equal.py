"""Token-for-token equality of the two engines' outputs in a compare-engines folder (and of each drafter's with our
`none`): one line per drafter and prompt.

    python greedy_equal.py FOLDER
"""
import json
import sys
from pathlib import Path


def outputs(path: Path) -> dict[tuple[str, str], list[int]]:
    return {(r["drafter"], r["prompt_id"]): r["output_ids"] for r in map(json.loads, path.open())}


def main():
    root = Path(sys.argv[1])
    ours, vllm = outputs(root / "dspark" / "records.jsonl"), outputs(root / "vllm" / "records.jsonl")
    for key in sorted(ours):
        a, b = ours[key], vllm.get(key)
        where = None if b is None else next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        same = b is not None and a == b
        line = f"{key[0]} {key[1]}: {len(a)} tokens; vLLM " + ("not run" if b is None else "equal" if same
                                                                   else f"differs from token {where}")
        if key[0] != "none":
            line += "; ours equal to ours none" if a == ours[("none", key[1])] else "; ours differs from ours none"
        print(line)


if __name__ == "__main__":
    main()
