"""The report of an import or export: one line per diffusion-pipe key, mapped (to which PipeTrain setting)
or not mapped (why, and what to do instead). Nothing is dropped silently: a key the importer does not
know is listed as "unknown"."""
from __future__ import annotations

from dataclasses import dataclass, field

MAPPED, NOT_MAPPED, UNKNOWN = "mapped", "not mapped", "unknown"


@dataclass(frozen=True)
class Entry:
    key: str  # dotted, as in the TOML: "epochs", "model.type", "directory[0].path"
    status: str  # MAPPED | NOT_MAPPED | UNKNOWN
    target: str = ""  # the PipeTrain setting, e.g. "train.epochs" or "cache.dataset.resolution"
    note: str = ""  # why not, what to do, or what the mapping changes

    def line(self) -> str:
        head = f"{self.key}: {self.status}" + (f" -> {self.target}" if self.target else "")
        return head + (f" ({self.note})" if self.note else "")


@dataclass
class Report:
    source: str  # "main" or "dataset" file name, shown as the heading of its lines
    entries: list[Entry] = field(default_factory=list)

    def mapped(self, key: str, target: str, note: str = "") -> None:
        self.entries.append(Entry(key, MAPPED, target, note))

    def not_mapped(self, key: str, note: str) -> None:
        self.entries.append(Entry(key, NOT_MAPPED, "", note))

    def unknown(self, key: str) -> None:
        self.entries.append(Entry(key, UNKNOWN, "", "a key this importer does not know: check its spelling, or "
                                  "set the PipeTrain setting it stands for by hand"))

    def status(self) -> dict[str, str]:
        return {e.key: e.status for e in self.entries}

    def text(self) -> str:
        return "\n".join([f"[{self.source}]"] + [e.line() for e in self.entries])


@dataclass
class Reports:
    """An import's or export's reports (one per file read) and the next steps it leaves to the user."""
    parts: list[Report]
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        blocks = [r.text() for r in self.parts]
        if self.notes:
            blocks.append("\n".join(["[next steps]"] + [f"- {n}" for n in self.notes]))
        return "\n\n".join(blocks)

    def counts(self) -> dict[str, int]:
        out = {MAPPED: 0, NOT_MAPPED: 0, UNKNOWN: 0}
        for r in self.parts:
            for e in r.entries:
                out[e.status] += 1
        return out
