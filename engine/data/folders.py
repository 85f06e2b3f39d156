"""Typed folder names -> absolute folders (LoadDataset's 'folders' lines and its single-folder inputs),
and listing a dataset folder with what the listing leaves out (subfolders, media without a known
extension), so nothing is dropped without a word.

Relative folders are resolved against a base folder (ComfyUI's input folder); `..` may leave it
(absolute paths are allowed anyway). Surrounding quotes are removed, because "Copy as path" on
Windows adds them; quotes also keep spaces at the ends of a name, and a '|' or a leading '#' in
it. On Linux/macOS a path with backslashes that does not exist is retried with '/'.
"""
from __future__ import annotations

import os
import re
import sys

from .file_kinds import media_kind, read_head
from .images import FolderListing, list_folder, name_key
from .messages import DatasetError

_WINDOWS_PATH = re.compile(r"^([A-Za-z]:[\\/]|\\\\)")  # C:\data, C:/data, \\server\share


def unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]  # quoted: keep the spaces inside
    return text.strip("\"'").strip()


def read_folder_lines(text: str, base_dir: str | None, default_repeats: int = 1
                      ) -> tuple[list[tuple[str, int]], list[str]]:
    """LoadDataset's 'folders' box -> ([(absolute folder, repeats)], notes on the lines not used).

    One folder per line, optionally followed by '| repeats=N'. Blank lines and lines starting with
    '#' are not used; each '#' line gets a note (naming the folder when one of that name exists,
    with the quoted line that trains it). A quoted folder ends at its closing quote, so a '|' or a
    leading '#' inside the quotes is part of its name.
    """
    folders, notes = [], []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            notes.append(_comment_note(lineno, line, base_dir))
            continue
        typed, option = _split_line(line, lineno)
        repeats = default_repeats if option is None else _repeats(option, line, lineno)
        typed = unquote(typed)
        if not typed:
            raise DatasetError(f"folders line {lineno} ({line!r}) names no folder: write the folder before "
                               "'|', e.g. 'cats | repeats=3'.")
        folders.append((resolve_folder(typed, base_dir, lineno), repeats))
    if not folders:
        raise DatasetError("no dataset folders given: enter at least one folder, one per line (relative to ComfyUI's "
                           "input folder, or absolute)." + "".join(f" {n}" for n in notes))
    return folders, notes


def _split_line(line: str, lineno: int) -> tuple[str, str | None]:
    """(the folder as typed, the text after its '|' or None)."""
    end = line.rfind(line[0]) if line[0] in "\"'" else 0
    if end > 0:
        rest = line[end + 1:].strip()
        if not rest:
            return line[:end + 1], None
        if rest.startswith("|"):
            return line[:end + 1], rest[1:]
        raise DatasetError(f"folders line {lineno} ({line!r}) has {rest!r} after the quoted folder: only "
                           "'| repeats=N' may follow it, e.g. '\"my cats\" | repeats=3'.")
    if "|" in line:
        # the option part is after the LAST '|', so a '|' in an unquoted folder name still works
        path, _, option = line.rpartition("|")
        return path, option
    return line, None


def _repeats(option: str, line: str, lineno: int) -> int:
    key, eq, value = option.strip().replace(" ", "").partition("=")
    if key.lower() != "repeats" or not eq or not value.isdigit() or int(value) < 1:
        raise DatasetError(f"folders line {lineno} ({line!r}): after '|' write 'repeats=N' with N a whole number of "
                           "1 or more, e.g. 'cats | repeats=3'. If the '|' is part of the folder's name, put the "
                           "name in quotes: '\"a | b\"'.")
    return int(value)


def _comment_note(lineno: int, line: str, base_dir: str | None) -> str:
    note = f"folders line {lineno} ({line!r}) starts with '#', so it is a comment and is not used"
    path_part, bar, option = line.rpartition("|")
    for typed, quoted in ((line, f'"{line}"'), (path_part.strip(), f'"{path_part.strip()}" |{option}')):
        path = os.path.join(base_dir or "", os.path.expanduser(typed))
        if typed and (os.path.isabs(path) or base_dir) and os.path.isdir(path):
            return note + f": a folder named {typed!r} exists; to train it, write the line as {quoted}."
        if not bar:
            break
    return note + "."


def resolve_folder(typed: str, base_dir: str | None, lineno: int) -> str:
    candidates = [typed]
    if os.sep == "/" and "\\" in typed and not _WINDOWS_PATH.match(typed):
        candidates.append(typed.replace("\\", "/"))  # a Windows-style relative path; '\' is legal in names here
    where, path = "", ""
    for candidate in candidates:
        expanded = os.path.expanduser(candidate)
        if os.path.isabs(expanded):
            path, where = expanded, ""
        elif base_dir is None:
            raise DatasetError(f"folders line {lineno}: {typed!r} is a relative path but ComfyUI's input folder is "
                               "not known here: use an absolute path.")
        else:
            path = os.path.join(base_dir, expanded)
            where = f" (relative paths are looked up in ComfyUI's input folder {base_dir})"
        path = os.path.normpath(path)
        if os.path.isdir(path):
            return path
    path = os.path.normpath(os.path.join(base_dir or "", os.path.expanduser(typed)))
    if os.sep == "/" and _WINDOWS_PATH.match(typed):
        raise DatasetError(f"folders line {lineno}: {typed!r} looks like a Windows path, but this ComfyUI runs on "
                           f"{sys.platform}: enter the folder as this machine sees it (e.g. /home/me/datasets/cats).")
    if os.path.exists(path):
        raise DatasetError(f"dataset folder {path} is a file, not a folder{where}: fix line {lineno} of 'folders' "
                           f"to name the folder that holds the images (e.g. {os.path.dirname(path)}).")
    raise DatasetError(f"dataset folder {path} does not exist{where}: fix line {lineno} of 'folders', "
                       "or use an absolute path.")


def resolve_extra_folder(typed: str, base_dir: str | None, setting: str) -> str:
    """An absolute folder for a single-folder input such as `mask_folder` ('' stays ''), resolved like 'folders'."""
    text = unquote(typed or "")
    if not text:
        return ""
    try:
        return resolve_folder(text, base_dir, 0)
    except DatasetError:
        pass  # re-worded below: the messages of resolve_folder speak of 'folders' lines
    path = os.path.normpath(os.path.join(base_dir or "", os.path.expanduser(text)))
    if base_dir is None and not os.path.isabs(path):
        raise DatasetError(f"{setting} {text!r} is a relative path but ComfyUI's input folder is not known here: "
                           "use an absolute path.")
    where = "" if os.path.isabs(os.path.expanduser(text)) else \
        f" (relative paths are looked up in ComfyUI's input folder {base_dir})"
    what = "is a file, not a folder" if os.path.exists(path) else "does not exist"
    raise DatasetError(f"{setting} {path} {what}{where}: fix LoadDataset's '{setting}', or leave it empty.")


# ---- listing a dataset folder ----------------------------------------------------------------

def outside_link(folder: str, name: str) -> str | None:
    """Where the entry `name` of `folder` really is when it is a symbolic link that leaves the folder
    (its target, resolved, is neither in the folder nor below it); None for plain files and links
    that stay inside. The dataset scan skips such links unless follow_links is on."""
    path = os.path.join(folder, name)
    if not os.path.islink(path):
        return None
    target, root = os.path.realpath(path), os.path.realpath(folder)
    try:
        inside = os.path.commonpath([target, root]) == root
    except ValueError:  # Windows: another drive
        inside = False
    return None if inside else target


def list_dataset_folder(folder: str) -> FolderListing:
    try:
        return list_folder(folder)
    except FileNotFoundError:
        raise DatasetError(f"dataset folder {folder} does not exist: fix the path in LoadDataset's 'folders' "
                           "(relative paths are looked up in ComfyUI's input folder).") from None
    except OSError as e:
        raise DatasetError(f"cannot list dataset folder {folder} ({e.strerror}): make it readable for the user "
                           "running ComfyUI, or fix the path in LoadDataset's 'folders'.") from None


def media_subfolders(folder: str, listing: FolderListing, pair_folders: tuple[str, ...] = ()) -> list[str]:
    """The subfolders that hold images, except `pair_folders` (the mask/control folders, which hold images
    on purpose, and folders that are listed as dataset folders themselves)."""
    out = []
    skip = {os.path.normcase(os.path.realpath(p)) for p in pair_folders if p}
    for name in listing.subfolders:
        sub = os.path.join(folder, name)
        if os.path.normcase(os.path.realpath(sub)) in skip:
            continue
        try:
            if list_dataset_folder(sub).images:
                out.append(sub)
        except DatasetError:
            continue
    return out


def subfolder_warnings(folder: str, listing: FolderListing, pair_folders: tuple[str, ...] = ()) -> list[str]:
    """Subfolders are not scanned; say so when one holds images, so nothing is dropped silently."""
    return [f"subfolder {sub} holds images but subfolders are not scanned: add it as its own line in 'folders' if "
            "you want it." for sub in media_subfolders(folder, listing, pair_folders)]


_NOT_MEDIA = (".txt", ".caption", ".cap", ".tags", ".text", ".json", ".jsonl", ".csv", ".tsv", ".md", ".xml", ".yaml",
              ".yml", ".toml", ".ini", ".db", ".log", ".npy", ".npz", ".pt", ".safetensors", ".py", ".html", ".pdf")


def unlisted_media(folder: str, listing: FolderListing, caption_ext: str) -> list[str]:
    """Files whose name has no image/video extension but whose first bytes are an image or video
    ('photo', 'a.jpg_large', 'clip.apng'), each with the name that makes it count."""
    out = []
    for name in listing.other:
        if name.lower().endswith(caption_ext.lower()) or os.path.splitext(name)[1].lower() in _NOT_MEDIA:
            continue  # not opened: a folder of 100 000 sidecar files stays quick to scan
        path = os.path.join(folder, name)
        found = media_kind(read_head(path))
        if found:
            stem = name if name.count(".") == 0 else name.rsplit(".", 1)[0]
            out.append(f"{path} ({found[0]}: rename it to {stem}{found[1]})")
    return out


_CAPTION_LIKE = (".txt", ".caption", ".cap", ".tags", ".text")  # what captioning tools write


def caption_lookalikes(listing: FolderListing, caption_ext: str) -> dict[str, str]:
    """Text files that look like another tool's captions (a.caption, a.tags...), by name_key of their
    stem: an image without a caption_ext caption but with one of these is pointed out by the scan."""
    out: dict[str, str] = {}
    for name in listing.other:
        stem, ext = os.path.splitext(name)
        if ext.lower() in _CAPTION_LIKE and ext.lower() != caption_ext.lower():
            out.setdefault(name_key(stem), name)
    return out
