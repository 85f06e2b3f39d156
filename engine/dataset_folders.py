"""Typed folder names -> absolute folders: LoadDataset's 'folders' lines and its single-folder inputs.

Relative folders are resolved against a base folder (ComfyUI's input folder); `..` may leave it
(absolute paths are allowed anyway). Surrounding quotes are removed, because "Copy as path" on
Windows adds them; quotes also keep spaces at the ends of a name. On Linux/macOS a path with
backslashes that does not exist is retried with '/'.
"""
from __future__ import annotations

import os
import re
import sys

from .dataset_messages import DatasetError

_WINDOWS_PATH = re.compile(r"^([A-Za-z]:[\\/]|\\\\)")  # C:\data, C:/data, \\server\share


def unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]  # quoted: keep the spaces inside
    return text.strip("\"'").strip()


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
