"""The mutation score of the core, from a finished ``mutmut run`` (``make mutation``; mutation/README.md).

Reads every mutant's verdict from ``mutants/`` (mutmut's ``.meta`` files), sets aside the survivors that
``mutation/equivalent.yaml`` argues are equivalent (no output can change; each entry names the mutant, its change
and the argument, and counts only while the mutant's diff is still that change), and writes

    outputs/mutation/score.json   counts per file and in all, the score = caught / (generated - equivalent)
    outputs/mutation/survivors.md every survivor with its diff, and the argument where it is equivalent

Caught: killed by a test, or timed out (the covering tests ran 3x their clean time: an endless loop). A survivor
that is not argued equivalent is an output-changing survivor: it lowers the score and is listed first. Exit 1 when
the score is below ``--min`` (0.95).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CAUGHT = {"killed", "timeout", "segfault", "caught by type check"}


def mutated_files() -> set[str]:
    """The files pyproject.toml's [tool.mutmut] only_mutate names (a mutants/ folder may hold older files' results)."""
    import tomllib

    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"])


def verdicts(mutants: Path) -> dict[str, str]:
    from mutmut.stats import status_by_exit_code

    out = {}
    files = mutated_files()
    for meta in sorted(mutants.rglob("*.py.meta")):
        if str(meta.relative_to(mutants)).removesuffix(".meta") not in files:
            continue
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            out[name] = status_by_exit_code[code]
    return out


def partial(status: dict[str, str]) -> dict[str, str]:
    """Only the mutants already checked (to read a run still under way)."""
    return {k: v for k, v in status.items() if v != "not checked"}


def diff(name: str) -> str:
    """The mutant's change as ``-old`` / ``+new`` lines (mutmut's unified diff without its headers)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    text = get_diff_for_mutant(name)
    return "\n".join(line for line in text.splitlines()
                     if line[:1] in "+-" and not line.startswith(("+++", "---")))


def file_of(name: str) -> str:
    module = name.split(".x_")[0].split(".xǁ")[0]
    return module.replace(".", "/") + ".py"


def score(mutants: Path, equivalent: dict, minimum: float, checked_only: bool = False) -> tuple[dict, str]:
    status = verdicts(mutants)
    not_checked = len(status) - len(partial(status))
    if checked_only:
        status = partial(status)
    rows, survivors, stale = [], [], []
    for name, st in sorted(status.items()):
        if st in CAUGHT:
            rows.append((file_of(name), "caught"))
            continue
        change = diff(name)
        entry = equivalent.get(name)
        if entry is not None and entry["change"].strip() == change.strip():
            rows.append((file_of(name), "equivalent"))
            survivors.append((name, st, change, entry["why"]))
            continue
        if entry is not None:
            stale.append(name)
        rows.append((file_of(name), st))
        survivors.append((name, st, change, None))
    by_file: dict[str, Counter] = {}
    for f, st in rows:
        by_file.setdefault(f, Counter())[st] += 1
    total = Counter(st for _, st in rows)
    considered = len(rows) - total["equivalent"]
    result = {
        "generated": len(rows), "caught": total["caught"], "equivalent": total["equivalent"],
        "output_changing_survivors": considered - total["caught"],
        "score": round(total["caught"] / considered, 4) if considered else float("nan"), "minimum": minimum,
        "by_status": dict(total), "by_file": {f: dict(c) for f, c in sorted(by_file.items())},
        "stale_equivalence_entries": stale,
        "not_checked": not_checked, "counted_not_checked": not checked_only,
    }
    return result, render(result, survivors)


def render(result: dict, survivors: list) -> str:
    lines = [f"# Mutation score: {result['score']:.1%} of {result['generated'] - result['equivalent']} "
             f"output-changing mutants caught",
             "",
             f"{result['generated']} mutants of the core (mutmut); {result['caught']} caught (killed or timed out), "
             f"{result['equivalent']} argued equivalent in mutation/equivalent.yaml, "
             f"{result['output_changing_survivors']} output-changing survivors. Rerun: `make mutation`.", ""]
    if result["not_checked"]:
        how = ("counted as survivors" if result["counted_not_checked"] else
               "left out of the score (`--checked-only`: the run was stopped before it reached them)")
        lines += [f"{result['not_checked']} mutants were not checked by the run: {how}.", ""]
    open_ones = [s for s in survivors if s[3] is None]
    lines += [f"## Output-changing survivors ({len(open_ones)})", ""]
    for name, st, change, _ in open_ones:
        lines += [f"- `{name}` ({st})", "", "```diff", change, "```", ""]
    eq = [s for s in survivors if s[3] is not None]
    lines += [f"## Equivalent survivors ({len(eq)})", ""]
    for name, st, change, why in eq:
        lines += [f"- `{name}`: {why}", "", "```diff", change, "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=Path, default=ROOT / "mutants")
    ap.add_argument("--equivalent", type=Path, default=ROOT / "mutation" / "equivalent.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "mutation")
    ap.add_argument("--min", type=float, default=0.95, dest="minimum")
    ap.add_argument("--checked-only", action="store_true", help="leave out mutants not checked yet (a run under way)")
    a = ap.parse_args(argv)
    if not any(a.mutants.rglob("*.py.meta")):
        print(f"no mutmut results under {a.mutants}: run `make mutation` first", file=sys.stderr)
        return 2
    equivalent = yaml.safe_load(a.equivalent.read_text()) or {} if a.equivalent.exists() else {}
    result, text = score(a.mutants, equivalent, a.minimum, a.checked_only)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "score.json").write_text(json.dumps(result, indent=2) + "\n")
    (a.out / "survivors.md").write_text(text + "\n")
    print(f"mutation score {result['score']:.1%}: {result['caught']} caught of {result['generated']} mutants, "
          f"{result['equivalent']} equivalent, {result['output_changing_survivors']} output-changing survivors "
          f"({a.out / 'score.json'}, survivors.md)")
    return 0 if result["score"] >= a.minimum else 1


if __name__ == "__main__":
    sys.exit(main())
