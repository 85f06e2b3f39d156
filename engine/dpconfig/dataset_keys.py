"""What each key of a diffusion-pipe dataset TOML becomes in PipeTrain's dataset settings (the cache config's
`dataset`, engine/data/scan.py DatasetSpec): every key mapped, not mapped with the reason, or unknown.
"""
from __future__ import annotations

import json
import math
from typing import Any

from ..data.scan import RESOLUTION_STEP
from .report import MAPPED, Report
from .values import Draft, Where

DS = "cache.dataset"
BUCKET_KEYS = ("resolutions", "enable_ar_bucket", "min_ar", "max_ar", "num_ar_buckets", "ar_buckets", "frame_buckets")
# Settings a [[directory]] may override; PipeTrain has one of each per dataset.
DIRECTORY_OVERRIDES = BUCKET_KEYS + ("cache_shuffle_num", "cache_shuffle_delimiter", "skip_empty_caption",
                                     "caption_prefix", "shuffle_tags", "size_buckets")
TOP_NOT_MAPPED = {
    "size_buckets": "PipeTrain buckets by resolution and aspect ratio (resolutions, ar_buckets)",
    "shuffle_tags": "use cache_shuffle_num (PipeTrain: tag_shuffles)",
    "shuffle_metadata": "PipeTrain has no metadata captions",
    "subsample_ratio": "PipeTrain uses every item (lower a folder's repeats instead)",
    "online_captions": "PipeTrain encodes captions at cache time",
}


def side_of(where: Where, key: str, value: Any) -> int:
    """A resolution as the side of a square: a number, or the area of a [width, height] pair."""
    if isinstance(value, list):
        w, h = where.numbers(key, value) if len(value) == 2 else (0, 0)
        if not (w > 0 and h > 0):
            raise where.fail(key, f"is {value!r}: give a side (512) or a [width, height] pair.")
        return int(round(math.sqrt(w * h) / RESOLUTION_STEP) * RESOLUTION_STEP)
    return where.whole(key, value, 1)


def ratios_of(where: Where, key: str, value: Any) -> list[float]:
    if not isinstance(value, list) or not value:
        raise where.fail(key, f"is {value!r}: give width/height ratios ([1.0, 1.5]) or [width, height] pairs.")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, list):
            w, h = where.numbers(f"{key}[{i}]", v) if len(v) == 2 else (0, 0)
            if not (w > 0 and h > 0):
                raise where.fail(f"{key}[{i}]", f"is {v!r}: give a [width, height] pair.")
            out.append(w / h)
        else:
            out.append(where.number(f"{key}[{i}]", v))
    return [round(r, 4) for r in out]


def spaced_ratios(low: float, high: float, count: int) -> list[float]:
    """count ratios from low to high, evenly spaced in log space (diffusion-pipe's min_ar/max_ar/num_ar_buckets)."""
    if count == 1:
        return [round(low, 4)]
    return [round(low * (high / low) ** (i / (count - 1)), 4) for i in range(count)]


class DatasetKeys:
    def __init__(self, cfg: dict[str, Any], where: Where, draft: Draft, report: Report):
        self.cfg, self.where, self.draft, self.report = cfg, where, draft, report

    def put(self, key: str, target: str, value: Any, note: str = "") -> None:
        self.report.mapped(key, self.draft.set(target, value), note)

    def run(self) -> None:
        w, cfg = self.where, self.cfg
        directories = cfg.get("directory")
        if not isinstance(directories, list) or not directories or not all(isinstance(d, dict) for d in directories):
            raise w.fail("[[directory]]", "is missing: add at least one [[directory]] table with path = '...'.")
        self.settings()
        groups = self.groups(directories)
        datasets = [self.draft.cache["dataset"] if not over else self.own_settings(over) for over in groups]
        keys = [json.dumps(over, sort_keys=True) for over in groups]
        for i, entry in enumerate(directories):
            n = keys.index(json.dumps(self.overrides(entry), sort_keys=True))
            self.directory(i, entry, datasets[n], DS if n == 0 else f"{DS}.more[{n - 1}]")
        for data in datasets:
            self.batch_sizes(data)
        if len(datasets) > 1:
            self.draft.cache["dataset"]["more"] = datasets[1:]

    def settings(self) -> None:
        """The top-level keys: the settings of the dataset of every [[directory]] that overrides none of them."""
        for key, value in self.cfg.items():
            if key == "directory":
                continue
            if key in BUCKET_KEYS:
                continue  # below, together
            handler = getattr(self, f"key_{key}", None)
            if handler:
                handler(key, value)
            elif key in TOP_NOT_MAPPED:
                self.report.not_mapped(key, TOP_NOT_MAPPED[key])
            else:
                self.report.unknown(key)
        self.buckets()

    # ---- [[directory]] overrides: chained datasets ----------------------------------------------
    def overrides(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in entry.items() if k in DIRECTORY_OVERRIDES and not (k in self.cfg and self.cfg[k] == v)}

    def groups(self, directories: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The datasets the directories make: one per distinct set of overrides, the top-level settings' first
        (when a directory has no overrides), the others in the order they first appear (LoadDataset's add_to)."""
        keyed = [json.dumps(self.overrides(d), sort_keys=True) for d in directories]
        order = sorted(dict.fromkeys(keyed), key=lambda k: (k != "{}", keyed.index(k)))
        return [json.loads(k) for k in order]

    def own_settings(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """A dataset of its own: the top-level settings with a directory's overrides (reported with the directory)."""
        merged = {**{k: v for k, v in self.cfg.items() if k != "directory"}, **overrides}
        sub = DatasetKeys(merged, self.where, Draft(), Report("overrides"))
        sub.settings()
        self.scratch = getattr(self, "scratch", {})
        self.scratch[json.dumps(overrides, sort_keys=True)] = {e.key: e for e in sub.report.entries}
        for key in ("clip_mode", "video_frames"):  # main-TOML settings the draft keeps with the first dataset
            if key in self.draft.cache["dataset"]:
                sub.draft.cache["dataset"][key] = self.draft.cache["dataset"][key]
        return sub.draft.cache["dataset"]

    def batch_sizes(self, data: dict[str, Any]) -> None:
        """micro_batch_size_per_gpu's per-resolution list, for the resolutions this dataset has."""
        have = [data.get("resolution"), *data.get("extra_resolutions", [])]
        pairs = [p for p in self.draft.batch_sizes if p[0] in have]
        if pairs:
            data["batch_sizes"] = pairs

    # ---- buckets --------------------------------------------------------------------------
    def buckets(self) -> None:
        w, cfg = self.where, self.cfg
        if "resolutions" not in cfg:
            raise w.fail("resolutions", "is missing: add resolutions = [512] (the side of the square training size).")
        given = cfg["resolutions"] if isinstance(cfg["resolutions"], list) and cfg["resolutions"] else None
        sides = [side_of(w, f"resolutions[{i}]", v) for i, v in enumerate(given)] if given else \
            [side_of(w, "resolutions", cfg["resolutions"])]
        several = len(sides) > 1 or any(isinstance(v, list) for v in given or ())
        self.put("resolutions", f"{DS}.resolution", sides[0], "the first; the others -> extra_resolutions; [w, h] "
                 "pairs as the side of a square of that area" if several else "")
        self.draft.set(f"{DS}.extra_resolutions", sides[1:])
        ar_on = w.flag("enable_ar_bucket", cfg.get("enable_ar_bucket", False))
        ratios: list[float] = []
        if "ar_buckets" in cfg:
            ratios = ratios_of(w, "ar_buckets", cfg["ar_buckets"])
        elif ar_on:
            missing = [k for k in ("min_ar", "max_ar", "num_ar_buckets") if k not in cfg]
            if missing:
                raise w.fail(missing[0], "is missing: with enable_ar_bucket = true give min_ar, max_ar and "
                             "num_ar_buckets (or ar_buckets).")
            low, high = w.number("min_ar", cfg["min_ar"]), w.number("max_ar", cfg["max_ar"])
            count = w.whole("num_ar_buckets", cfg["num_ar_buckets"], 1)
            if not 0 < low <= high:
                raise w.fail("min_ar", f"is {low:g} with max_ar {high:g}: use 0 < min_ar <= max_ar.")
            ratios = spaced_ratios(low, high, count)
        ratios = ratios if ar_on else []
        self.draft.set(f"{DS}.aspect_ratios", ratios)
        if "enable_ar_bucket" in cfg:
            self.put("enable_ar_bucket", f"{DS}.aspect_ratios", ratios, "false: square only")
        for key in ("min_ar", "max_ar", "num_ar_buckets", "ar_buckets"):
            if key not in cfg:
                continue
            if not ar_on:
                self.report.not_mapped(key, "enable_ar_bucket is false: PipeTrain trains square images")
            elif key != "ar_buckets" and "ar_buckets" in cfg:
                self.report.not_mapped(key, "ar_buckets is given, which sets the ratios")
            else:
                self.report.mapped(key, f"{DS}.aspect_ratios")
        if "frame_buckets" in cfg:
            frames = [w.whole(f"frame_buckets[{i}]", v, 1) for i, v in enumerate(cfg["frame_buckets"])] \
                if isinstance(cfg["frame_buckets"], list) else [w.whole("frame_buckets", cfg["frame_buckets"], 1)]
            videos = sorted(set(f for f in frames if f > 1))
            note = "images always train in PipeTrain (bucket 1); each video to the longest of the other buckets it " \
                   "fills" if videos else "no video bucket: videos are skipped"
            self.put("frame_buckets", f"{DS}.frame_buckets", videos, note)

    # ---- top-level keys ---------------------------------------------------------------------
    def key_cache_shuffle_num(self, key: str, value: Any) -> None:
        self.put(key, f"{DS}.tag_shuffles", self.where.whole(key, value, 0))

    def key_cache_shuffle_delimiter(self, key: str, value: Any) -> None:
        if self.where.text(key, value).strip() == ",":
            self.report.mapped(key, f"{DS}.tag_shuffles", "PipeTrain splits tags at commas")
        else:
            self.report.not_mapped(key, "PipeTrain splits tags at commas only")

    def key_skip_empty_caption(self, key: str, value: Any) -> None:
        if self.where.flag(key, value):
            self.report.not_mapped(key, "PipeTrain trains an image without a caption file on the empty caption "
                                   "(and lists those files): remove such images to skip them")
        else:
            self.report.mapped(key, DS, "PipeTrain trains images without a caption file on the empty caption")

    def key_caption_prefix(self, key: str, value: Any) -> None:
        self.put(key, f"{DS}.caption_prefix", self.where.text(key, value))

    def key_num_repeats(self, key: str, value: Any) -> None:
        self.where.whole(key, value, 1)
        self.report.mapped(key, f"{DS}.folders[].repeats", "the default of every [[directory]]")

    # ---- [[directory]] ---------------------------------------------------------------------
    def directory(self, i: int, entry: dict[str, Any], data: dict[str, Any], target: str) -> None:
        w, at = self.where, f"directory[{i}]"
        if "path" not in entry:
            raise w.fail(f"{at}.path", "is missing: give the folder of images/videos and captions.")
        folders = data.setdefault("folders", [])
        folder = {"path": w.path_of(f"{at}.path", entry["path"]),
                  "repeats": w.whole(f"{at}.num_repeats", entry.get("num_repeats", self.cfg.get("num_repeats", 1)), 1)}
        folders.append(folder)
        own = self.overrides(entry)
        scratch = getattr(self, "scratch", {}).get(json.dumps(own, sort_keys=True), {})
        for key, value in entry.items():
            name = f"{at}.{key}"
            if key == "path":
                self.report.mapped(name, f"{target}.folders[{len(folders) - 1}].path",
                                   "PipeTrain trains every folder listed")
            elif key == "num_repeats":
                self.report.mapped(name, f"{target}.folders[{len(folders) - 1}].repeats")
            elif key in ("mask_path", "control_path"):
                self.side_folder(name, key, w.path_of(name, value), data, target)
            elif key in DIRECTORY_OVERRIDES and key not in own:
                self.report.mapped(name, target, "the same as the top-level value")
            elif key in DIRECTORY_OVERRIDES:
                said = scratch.get(key)
                if said is not None and said.status != MAPPED:
                    self.report.not_mapped(name, said.note)
                else:
                    self.report.mapped(name, target, "this directory's own setting: it trains as a dataset of its "
                                       "own (chained datasets, each cached on its own, one sample order)")
            else:
                self.report.unknown(name)

    def side_folder(self, name: str, key: str, path: str, data: dict[str, Any], target: str) -> None:
        setting = "mask_folder" if key == "mask_path" else "control_folder"
        before = data.get(setting)
        if before and before != path:
            self.report.not_mapped(name, f"PipeTrain has one {key.split('_')[0]} folder per dataset ({before}): "
                                   "put all masks in it, named as their images")
        else:
            data[setting] = path
            self.report.mapped(name, f"{target}.{setting}", "matched to images by file name")
