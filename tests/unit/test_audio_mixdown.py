"""engine/cache/audio_latents.py's stereo mix of a track with more than two channels, and the audio window of a
clip (engine/data/audio.py): plain numpy and PyAV, no ComfyUI."""
from __future__ import annotations

import numpy as np
from pack import load_pack

load_pack()
from PipeTrain.engine.cache.audio_latents import mixed_down  # noqa: E402
from PipeTrain.engine.data.audio import ClipAudio, _window  # noqa: E402


def test_a_known_layout_is_mixed_by_ffmpeg_to_stereo():
    wave = np.zeros((6, 480), np.float32)
    wave[0] = 0.5  # 5.1's front left only
    mixed = mixed_down(ClipAudio(wave, 48000, "5.1"))
    assert mixed.waveform.shape == (2, 480) and mixed.layout == "stereo"
    assert mixed.waveform[0].mean() > 0.1 and abs(mixed.waveform[1]).max() < 1e-6  # left stays left


def test_an_unknown_layout_averages_even_channels_left_and_odd_ones_right():
    wave = np.arange(12, dtype=np.float32).reshape(6, 2)
    mixed = mixed_down(ClipAudio(wave, 16000))
    np.testing.assert_array_equal(mixed.waveform, [[4.0, 5.0], [6.0, 7.0]])


def test_the_window_is_silence_where_the_track_has_no_samples():
    track = np.ones((2, 100), np.float32)
    out = _window(track, 100, offset=-0.2, seconds=0.5)  # the clip starts 0.2 s before the track
    assert out.shape == (2, 50) and out[:, :20].sum() == 0 and (out[:, 20:] == 1).all()
    assert (_window(track, 100, offset=0.9, seconds=0.3)[:, 10:] == 0).all()  # and ends after it
