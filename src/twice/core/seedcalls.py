"""The script's own seeding calls of two runs compared, in words (pure: the manifests' `seeding`
records in, a clause out; runtime/seedcalls.py records them)."""

from __future__ import annotations

__all__ = ["seeding_difference", "SEEDED"]

# What each watched API seeds, as a sentence names it.
SEEDED = {
    "torch.manual_seed": "torch",
    "torch.seed": "torch",
    "torch.Generator.manual_seed": "a torch.Generator",
    "torch.Generator.seed": "a torch.Generator",
    "torch.default_generator.manual_seed": "torch",
    "torch.default_generator.seed": "torch",
    "torch.cuda.manual_seed": "CUDA",
    "torch.cuda.manual_seed_all": "CUDA",
    "torch.cuda.seed": "CUDA",
    "torch.cuda.seed_all": "CUDA",
    "numpy.random.seed": "NumPy",
    "numpy.random.default_rng": "a NumPy Generator",
    "numpy.random.RandomState": "a NumPy RandomState",
    "numpy.random.SeedSequence": "a NumPy SeedSequence",
    "numpy.random.PCG64": "a NumPy PCG64",
    "numpy.random.PCG64DXSM": "a NumPy PCG64DXSM",
    "numpy.random.Philox": "a NumPy Philox",
    "numpy.random.MT19937": "a NumPy MT19937",
    "numpy.random.SFC64": "a NumPy SFC64",
    "random.seed": "Python's random",
    "random.Random": "a random.Random",
    "random.Random.seed": "a random.Random",
}


def _differs(api: str, site: str, a: dict | None, b: dict | None, watched: tuple) -> str | None:
    """How one API's calls at one line differ between the runs, or None."""
    what = SEEDED.get(api, api)
    if a is not None and b is not None:
        if a["entropy"] or b["entropy"]:
            return (
                f"the script seeds {what} from OS entropy at {site} (`{api}` without a seed), "
                "with another value in each run"
            )
        if a["values"] != b["values"] or a["calls"] != b["calls"]:
            return f"the script seeds {what} itself at {site}, with another value in each run"
        return None
    # a call one run made: a difference only where the other run watched that API
    label, other = ("A", watched[1]) if a is not None else ("B", watched[0])
    if api not in other:
        return None
    return f"the script seeds {what} at {site} in run {label} only"


def _place(site: str) -> tuple[str, int]:
    """A site's file and line, so that line 9 of a file comes before its line 10."""
    name, _, line = site.rpartition(":")
    return (name, int(line)) if line.isdigit() else (site, 0)


_SCRIPT = "\0script"  # the key of a call in the run's own script, whatever its name


def _key(site: str, script: str | None) -> tuple[str, int]:
    """Where a call is, as both runs' calls are matched: a call in the run's script by its line
    alone (a renamed script, a copy run: the same code), any other by its file and line."""
    name, line = _place(site)
    return (_SCRIPT, line) if script and name == script else (name, line)


def seeding_difference(
    a: dict | None, b: dict | None, scripts: tuple[str | None, str | None] = (None, None)
) -> str | None:
    """The first difference in the script's own seeding calls (API and line, the digest of the
    values, how many), as a clause naming the line: "the script seeds torch itself at
    clock_seed.py:2, with another value in each run". None where they agree, or where a run
    has no record of them (made by an older twice, or outside `twice run`). `scripts`: each
    run's script as its call sites name it (compare._script_site), so that calls in scripts of
    different names compare line by line."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    calls, shown = [{}, {}], {}
    for side, run in enumerate((a, b)):
        for call in run.get("calls", []):
            key = (call["api"], _key(call["site"], scripts[side]))
            calls[side][key] = call
            shown.setdefault(key, call["site"])  # named as run A names it where it has it
    watched = (tuple(a.get("watched", [])), tuple(b.get("watched", [])))
    found = []
    for key in sorted(set(calls[0]) | set(calls[1]), key=lambda k: (*k[1], k[0])):
        api = key[0]
        clause = _differs(api, shown[key], calls[0].get(key), calls[1].get(key), watched)
        if clause is not None:
            found.append(clause)
    if not found:
        return None
    # the values that change from run to run first: they change the run wherever they are used
    found.sort(key=lambda clause: "in each run" not in clause)
    more = len(found) - 1
    return found[0] + (
        f" ({more} more seeding call{'s differ' if more > 1 else ' differs'})" if more else ""
    )
