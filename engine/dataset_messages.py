"""The dataset scan's grouped warnings: (kind, template), in the order they are shown.

Templates take {n} (how many files), {examples} (the first few names) and the fill values
engine/dataset.py passes ({ext}, {res}, {limit}, {need}). Each says what happened and the fix.
"""
from __future__ import annotations

# Grouped warnings, in this order: (kind, template with {n} and {examples}).
WARNINGS = (
    ("unreadable", "{n} image(s) cannot be read and are skipped: {examples}"),
    ("videos", "{n} video file(s) are skipped: set LoadDataset's 'video_frames' (e.g. 17 for Wan) to train on "
               "them: {examples}"),
    ("short", "{n} video(s) are shorter than one clip ({need} frames for video_frames x frame_stride) and are "
              "skipped: lower video_frames or frame_stride, or remove them: {examples}"),
    ("unsupported", "{n} file(s) are in a format PipeTrain cannot read and are skipped: {examples}"),
    ("hidden", "{n} hidden file(s) (names starting with '.') are skipped; rename them without the leading dot to "
               "train on them: {examples}"),
    ("missing", "{n} image(s) have no caption file ({ext}); they train with the empty caption: {examples}"),
    ("caption_unreadable", "{n} caption file(s) cannot be read; their images train with the empty caption: "
                           "{examples}"),
    ("empty_caption", "{n} caption file(s) are empty; their images train with the empty caption: {examples}"),
    ("not_utf8", "{n} caption file(s) are not UTF-8 and were read as Windows-1252/Latin-1; check that accents look "
                 "right, then save them as UTF-8: {examples}"),
    ("utf16_no_bom", "{n} caption file(s) look like UTF-16 without a byte-order mark and were read as such; save "
                     "them as UTF-8: {examples}"),
    ("caption_case", "{n} caption file(s) match their image only when ignoring upper/lower case and are used: "
                     "{examples}"),
    ("shared_caption", "{n} caption file(s) are shared by images with the same name and different extensions; every "
                       "one of those images trains with it (give each its own name and caption if they differ): "
                       "{examples}"),
    ("animated", "{n} animated image(s): only the first frame is trained (save them as MP4/WebM and set "
                 "video_frames to train on motion): "
                 "{examples}"),
    ("small", "{n} image(s) are smaller than the resolution ({res}) on their shorter side and are upscaled, which "
              "looks blurry to the model; use larger images or a lower resolution: {examples}"),
    ("aspect", "{n} image(s) are more than 3 times wider than tall (or taller than wide) for their bucket; only the "
               "center part of that shape is trained, so crop them yourself to choose what is kept, or add aspect "
               "ratios: {examples}"),
    ("huge", "{n} image(s) are over Pillow's decompression-bomb warning limit ({limit} megapixels); they load, but "
             "slowly and with a lot of memory: downscale them to speed up caching: {examples}"),
)
