"""The premise "same input files" of a cause, computed from what two runs' records cover of the
files they read: which files differ (by digest, or by size and time where a run did not hash
them), which one run read alone, and what neither record can vouch for (pure: manifests in,
words out)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from twice.core.manifest import MISSING, Difference, Manifest

__all__ = ["InputPremise", "judge_inputs", "code_names"]

_NOT_HASHED = "not hashed: "
_SHOWN = 3  # files named in a sentence before "and N more"


@dataclass(frozen=True)
class InputPremise:
    """How the files two runs read compare, and what of them their records cover."""

    recorded: bool  # both runs recorded the files they read (a run outside `twice run` did not)
    differing: tuple[str, ...] = ()  # one phrase per file that differs, or that one run read
    gaps: tuple[str, ...] = ()  # what the records do not cover, in words
    by_time: str | None = None  # the files compared by size and time only, in words
    by_time_differs: bool = False  # a file that differs was compared by size and time only

    @property
    def complete(self) -> bool:
        """Every file both runs read was recorded and compared by its content."""
        return self.recorded and not self.gaps

    def clause(self) -> str | None:
        """The cause where a file differs: the files, and how far the comparison reaches."""
        if not self.differing:
            return None
        named = ", ".join(self.differing[:_SHOWN])
        if len(self.differing) > _SHOWN:
            named += f" and {len(self.differing) - _SHOWN} more"
        lead = f"{self.by_time}; " if self.by_time_differs and self.by_time else ""
        return f"the runs read different data: {lead}{named}"

    def unknown(self) -> str:
        """What the records do not cover, where "same input files" cannot be said."""
        return "; ".join(self.gaps)


def _shown(path: str, cwd: str) -> str:
    """A file as a sentence names it: relative to the working folder when near it."""
    if not (posixpath.isabs(path) and posixpath.isabs(cwd)):
        return path
    relative = posixpath.relpath(path, cwd)
    return path if relative.startswith("../../../") else relative


def _count(n: int, what: str) -> str:
    """`n` files and what they are: "1 file read ...", "3 files read ..."."""
    return f"{n} file {what}" if n == 1 else f"{n} files {what}"


def _files(manifest: Manifest) -> dict[str, dict]:
    entries = manifest.context.get("inputs") or []
    return {e["path"]: e for e in entries if isinstance(e, dict) and "path" in e}


def _everywhere(manifest: Manifest) -> bool:
    coverage = manifest.context.get("inputs_coverage") or {}
    return coverage.get("scope") == "everywhere"


def judge_inputs(
    a: Manifest, b: Manifest, diffs: list[Difference]
) -> tuple[list[Difference], InputPremise]:
    """The identity differences with those of input files that the records show equal as far
    as both can tell (one run hashed a file, the other compared it by size and time, and those
    agree) left out, and the premise: what differs and what is not covered."""
    recorded = "inputs" in a.identity and "inputs" in b.identity
    if not recorded:
        return diffs, InputPremise(False)
    ids = (a.identity.get("inputs") or {}, b.identity.get("inputs") or {})
    files = (_files(a), _files(b))
    everywhere = (_everywhere(a), _everywhere(b))
    both = set(ids[0]) & set(ids[1])
    # read, and gone by a run's end: nothing to compare it by, so it is a gap, not a difference
    gone = {p for f in files for p, e in f.items() if e.get("gone") and not e.get("made_by_run")}
    by_time = {p for p in both if any(str(x[p]).startswith(_NOT_HASHED) for x in ids)}
    kept, differing, alone, by_time_differs = [], [], [], False
    for d in diffs:
        if d.group != "data" or not d.key.startswith("inputs."):
            kept.append(d)
            continue
        path = d.key.removeprefix("inputs.")
        shown = _shown(path, a.cwd)
        if path in gone and path in both:
            continue  # named below as a gap
        if MISSING in (d.a, d.b):
            lacking = 1 if d.b == MISSING else 0
            if not everywhere[lacking] and posixpath.isabs(path):
                continue  # outside what that run's (older) record covers: a gap, below
            alone.append(f"{shown} was read by {'B' if lacking == 0 else 'A'} only")
        elif path in by_time:
            sizes = [(f[path].get("size"), f[path].get("mtime_ns")) for f in files if path in f]
            if len(sizes) == 2 and sizes[0] == sizes[1]:
                continue  # hashed in one run only; size and time agree: equal as far as known
            differing.append(f"{shown} differs in size or modification time")
            by_time_differs = True
        else:
            differing.append(f"{shown} differs")
        kept.append(d)
    gaps = []
    older = [label for label, full in zip("AB", everywhere) if not full]
    if older:
        gaps.append(
            "files read outside the working and --inputs folders were not recorded in "
            f"{' and '.join(older)} (recorded by an older twice)"
        )
    by_time_words = None
    if by_time:
        by_time_words = (
            _count(len(by_time), "read outside the working folder")
            + (" was" if len(by_time) == 1 else " were")
            + " compared by size and time only"
        )
        gaps.append(
            f"{by_time_words} (not hashed: over the budget; name their folder with --inputs "
            "to hash every file in it)"
        )
    flagged = {
        flag: {p for p in both for f in files if f.get(p, {}).get(flag)}
        for flag in ("sampled", "changed")
    }
    if flagged["sampled"]:
        n = len(flagged["sampled"])
        gaps.append(
            _count(n, "larger than 4 GiB")
            + (" was" if n == 1 else " were")
            + " compared by samples of its bytes"
        )
    if flagged["changed"]:
        n = len(flagged["changed"])
        gaps.append(_count(n, "changed while a run read it") + " (what was read is gone)")
    if gone:
        named = sorted(_shown(p, a.cwd) for p in gone)
        more = f" and {len(named) - _SHOWN} more" if len(named) > _SHOWN else ""
        verb = "was read but is" if len(named) == 1 else "were read but are"
        gaps.append(f"{', '.join(named[:_SHOWN])}{more} {verb} gone: not compared")
    gaps.extend(_unseen(a, b))
    if any((m.context.get("inputs_coverage") or {}).get("unrecorded") for m in (a, b)):
        gaps.append("a process read more than 100,000 files, and those after were not recorded")
    premise = InputPremise(
        True, tuple(differing + alone), tuple(gaps), by_time_words, by_time_differs
    )
    return kept, premise


def _unseen(a: Manifest, b: Manifest) -> list[str]:
    """What no hook of either run saw: standard input from a pipe, and programs the script
    started that are not Python, or Python started without twice's settings."""
    covers = [m.context.get("inputs_coverage") or {} for m in (a, b)]
    gaps = []
    piped = [label for label, c in zip("AB", covers) if c.get("stdin_pipe")]
    if piped:
        gaps.append(
            f"standard input was a pipe in {' and '.join(piped)}: data twice cannot see "
            "(give a file with `< FILE` to have it hashed)"
        )
    for key, what in (
        ("not_python", "that is not Python"),
        ("unwatched_python", "of Python started without twice's settings"),
    ):
        names = sorted({str(n) for c in covers for n in c.get(key) or []})
        if names:
            many = len(names) > 1
            gaps.append(
                f"{'processes' if many else 'a process'} {what} ({', '.join(names)}) may have "
                "read files twice cannot see"
            )
    return gaps


def code_names(keys: list[str]) -> list[str]:
    """The code a sentence names for identity keys of the code group: a source by its path, a
    Python file read as data (`exec(open(...).read())`, runpy) by its path and how it was read,
    first; other keys (the git facts) as they are."""
    named = []
    for key in keys:
        if key.startswith("code.read_as_data."):
            named.append((0, f"{key.removeprefix('code.read_as_data.')}, read as data"))
        elif key.startswith("code.sources."):
            named.append((1, key.removeprefix("code.sources.")))
        else:
            named.append((2, key))
    return [name for _, name in sorted(set(named))]
