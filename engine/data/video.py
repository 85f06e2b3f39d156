"""Video files on disk: `probe_video` (size, frame count, frame rate, frame timestamps) and
`load_video` (the clip the VAE encodes), through PyAV (the FFmpeg binding ComfyUI's own video
loading uses).

Frame sampling: a clip is `frames` frames from its start (the video's first frame unless LoadDataset's
clip_mode picks others: engine/data/frame_buckets.py), picked by timestamp at
`target_fps` (LoadDataset's setting), or every `stride`-th source frame when target_fps is 0
(engine/data/frame_picks.py decides which; the timestamps are the packets' presentation times,
read without decoding). Video models need particular counts (4k+1 for Wan/HunyuanVideo, 8k+1 for
LTXV): the user sets `frames` accordingly; a video too short for one clip is reported by the
dataset scan, never padded. Frames are resized and center-cropped exactly like images
(engine/data/images.py), to the video's bucket.

Rotation: phones store portrait videos as landscape frames plus a display rotation (the
container's display matrix); it is applied, like EXIF orientation for images, so the clip trains
upright and `probe_video` reports the size as displayed.

Transparency (ProRes 4444, PNG or QuickTime Animation in MOV) is composited over white, as for
images, rather than keeping whatever colour the hidden pixels have.

Every failure is a VideoReadError whose message names the file and says what to do.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from .frame_picks import pick_frames
from .images import _check_file, _resize_crop, _sniff, _to_rgb8

# FFmpeg demuxers that read single pictures: a video-named file that one of them opens is an image
_IMAGE_DEMUXERS = ("image2", "png_pipe", "jpeg_pipe", "webp_pipe", "bmp_pipe", "tiff_pipe")
_TRANSPOSE = {90: Image.Transpose.ROTATE_90, -90: Image.Transpose.ROTATE_270, 270: Image.Transpose.ROTATE_270,
              180: Image.Transpose.ROTATE_180, -180: Image.Transpose.ROTATE_180}


class VideoReadError(ValueError):
    """A video file that cannot be used; the message names it and says what to do."""


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    frames: int
    fps: float  # the container's average rate (the timestamps below are what sampling uses)
    times: tuple[float, ...] = ()  # every frame's presentation time in seconds, ascending


def needed_frames(frames: int, stride: int) -> int:
    return (frames - 1) * stride + 1


def _fail(path: str, exc: BaseException) -> VideoReadError:
    what = _sniff(path)
    if what and "video" not in what:  # a web page or document saved under a video's name
        return VideoReadError(f"{path} is really {what}, not a video: replace it with the video, or remove it")
    text = str(exc) or type(exc).__name__
    return VideoReadError(f"{path} cannot be decoded as a video ({text}): it is damaged, cut off or in a codec this "
                          "FFmpeg lacks; re-encode it as H.264 MP4 (e.g. ffmpeg -i in.mov -c:v libx264 out.mp4) or "
                          "remove it")


def _av(path: str):
    """PyAV, or a VideoReadError naming the file and the fix when it is not installed."""
    try:
        import av
    except ImportError:
        raise VideoReadError(f"{path} cannot be read: video support needs PyAV, which ComfyUI's requirements install "
                             "(pip install av in ComfyUI's Python), or set video_frames to 0") from None
    return av


def _rotation(frame) -> int:
    """Counter-clockwise display rotation of a decoded frame in degrees (0 without a display matrix)."""
    try:
        return round(float(getattr(frame, "rotation", 0) or 0))
    except (TypeError, ValueError):
        return 0


def frame_times(container) -> list[float]:
    """Presentation times (seconds, ascending) of the first video stream's frames, from its packets
    (no decoding). Packets FFmpeg marks to discard (cut by an edit list) are no frames. Without
    timestamps (some raw streams), frames are spaced at the container's rate, else FFmpeg's
    default of 25 fps."""
    stream = container.streams.video[0]
    pts = [p.pts for p in container.demux(stream) if p.size and not getattr(p, "is_discard", False)]
    if not pts or any(p is None for p in pts) or stream.time_base is None:
        rate = float(stream.average_rate or stream.guessed_rate or 0) or 25.0
        return [i / rate for i in range(len(pts))]
    base = float(stream.time_base)
    return sorted(p * base for p in pts)


def _picture(frame) -> Image.Image:
    """A decoded frame as 8-bit RGB; transparency (ProRes 4444, PNG-in-MOV...) composited over white
    as for images (engine/data/images.py), instead of keeping the hidden pixels' colour."""
    if any(c.is_alpha for c in frame.format.components):
        return _to_rgb8(Image.fromarray(frame.to_ndarray(format="rgba"), mode="RGBA"))
    return frame.to_image().convert("RGB")


def probe_video(path: str) -> VideoInfo:
    """Size and frame count. The frames are counted by demuxing packets (no decoding), since
    container headers often omit or misstate the count."""
    av = _av(path)

    try:
        _check_file(path)
    except Exception as e:  # image_io's checks name the file; say "video" consistently
        raise VideoReadError(str(e).replace("an image file", "a video file").replace("an image extension",
                                                                                     "a video extension")) from None
    try:
        with av.open(path) as container:
            if container.format.name in _IMAGE_DEMUXERS:
                kind = container.format.name.replace("_pipe", "").replace("image2", "image").upper()
                raise VideoReadError(f"{path} is really a still {kind} picture, not a video: rename it with its image "
                                     "extension (it then trains as an image), or remove it")
            if not container.streams.video:
                raise VideoReadError(f"{path} has no video stream (audio only?): remove it or replace it with a video")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            fps = float(stream.average_rate or stream.guessed_rate or 0)
            try:
                first = next(container.decode(stream), None)  # decodes at all? and its display rotation
            except av.error.EOFError:  # a header without a single frame
                first = None
            if first is not None and _rotation(first) in (90, -90, 270):
                width, height = height, width
        with av.open(path) as container:
            times = frame_times(container)
    except VideoReadError:
        raise
    except Exception as e:  # PyAV raises its own error types (InvalidDataError, ...)
        raise _fail(path, e) from None
    if not times or first is None or not width or not height:
        raise VideoReadError(f"{path} holds no video frames: re-export it, or remove it")
    return VideoInfo(width, height, len(times), fps, tuple(times))


def load_video(path: str, size: tuple[int, int], frames: int, stride: int = 1, target_fps: float = 0.0,
               start: float | None = None) -> np.ndarray:
    """float32 [frames, height, width, 3] in 0..1: the clip from `start` (seconds; None = the first frame), its
    frames picked by timestamp at target_fps, or every `stride`-th frame when target_fps is 0 (frame_picks.py)."""
    av = _av(path)

    out, picks = [], None
    try:
        with av.open(path) as container:
            picks = pick_frames(frame_times(container), frames, target_fps, stride, start)
        if picks is None and not target_fps:  # decode what there is: the error below says how many
            picks = list(range(0, needed_frames(frames, stride), stride))
        wanted = {}  # source frame index -> how often the clip shows it (a slow clip repeats frames)
        for i in picks or ():
            wanted[i] = wanted.get(i, 0) + 1
        with av.open(path) as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i in wanted:
                    picture = _picture(frame)
                    turn = _TRANSPOSE.get(_rotation(frame))
                    if turn is not None:
                        picture = picture.transpose(turn)
                    rgb = np.asarray(_resize_crop(picture, tuple(size)), dtype=np.float32) / 255.0
                    out += [rgb] * wanted[i]
                    if len(out) == frames:
                        break
    except Exception as e:
        raise _fail(path, e) from None
    if picks is None:
        raise VideoReadError(f"{path} is too short for one clip of {frames} frames at {target_fps:g} fps (stride "
                             f"{stride}): lower 'video_frames' or 'frame_stride', or remove it")
    if len(out) < frames:
        at = f"at {target_fps:g} fps, stride {stride}" if target_fps else f"stride {stride}"
        raise VideoReadError(f"{path} decoded to only {len(out)} usable frame(s) of the {frames} needed ({at}): "
                             "lower 'video_frames' or 'frame_stride', or re-encode the video")
    return np.clip(np.stack(out), 0.0, 1.0)

