"""LoadDataset's caption options through CacheLatents with a real (tiny) ComfyUI CLIP, and the picks training
makes from the cache (engine/train/caption_picks.py via collate): the prefix is in what the text encoder
encodes, keep_tokens keeps the first tag first in every shuffled order, three caption lines give three
encodings that training takes across epochs, and caption_dropout trains the seeded share of the samples
with the empty caption, encoded once, without encoding the items again."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from pack import load_pack

load_pack()
import PipeTrain.nodes.cache_latents as cache_node  # noqa: E402
import PipeTrain.nodes.load_dataset as load_node  # noqa: E402
from PipeTrain.engine.cache.caption_store import EMPTY_CAPTION, read_empty_caption  # noqa: E402
from PipeTrain.engine.cache.reader import CachedDataset  # noqa: E402
from PipeTrain.engine.data.caption_variants import split_tags  # noqa: E402
from PipeTrain.engine.launch.comfy_bootstrap import import_comfy  # noqa: E402
from PipeTrain.engine.train.caption_picks import dropped  # noqa: E402
from PipeTrain.engine.train.sample_order import SampleStream, collate  # noqa: E402
from tiny_encoders import tiny_image_encoders  # noqa: E402

pytestmark = pytest.mark.core  # also on ComfyUI 0.33
TAGS = "alice, red hair, smile, outdoors, blue sky"
LINES = "a photo of alice\nalice smiling in the park\n\nalice, close-up portrait"


@pytest.fixture(scope="module")
def encoders(comfy_root, tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/dataset_files.py: one thread is much faster on this busy machine
    import_comfy(comfy_root)
    yield tiny_image_encoders(tmp_path_factory.mktemp("models"))
    torch.set_num_threads(threads)


class Recording:
    """Delegates to a real ComfyUI CLIP and records every text it tokenizes (what gets encoded)."""

    def __init__(self, inner):
        self._inner, self.texts = inner, []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def tokenize(self, text, *args, **kwargs):
        self.texts.append(text)
        return self._inner.tokenize(text, *args, **kwargs)


def _folder(tmp_path, captions: dict[str, str | None]):
    folder = tmp_path / "set"
    folder.mkdir()
    for i, (name, caption) in enumerate(captions.items()):
        Image.new("RGB", (64, 64), (40 * i, 90, 200 - 30 * i)).save(folder / f"{name}.png")
        if caption is not None:
            (folder / f"{name}.txt").write_text(caption, encoding="utf-8")
    return folder


def _cache(folder, encoders, clip=None, **options):
    (spec,) = load_node.PipeTrainLoadDataset().load(folders=str(folder), resolution=64, repeats=1, **options)
    cache_spec, lines, _ = cache_node.PipeTrainCacheLatents().encode(spec, encoders[0], clip or encoders[1], False)
    return CachedDataset(cache_spec.cache_dir), lines[0]


def _encoded(clip, text):
    return clip.encode_from_tokens_scheduled(clip.tokenize(text))[0][0][0]


def test_prefix_is_in_what_the_text_encoder_encodes(encoders, tmp_path):
    folder = _folder(tmp_path, {"a": TAGS, "b": None})
    clip = Recording(encoders[1])
    ds, _ = _cache(folder, encoders, clip, caption_prefix="ohwx, ")
    assert sorted(clip.texts) == ["ohwx", f"ohwx, {TAGS}"]  # the captionless image: the prefix alone
    by_source = {ds[i]["source"]: ds[i] for i in range(len(ds))}
    assert by_source["a.png"]["caption"] == f"ohwx, {TAGS}"
    torch.testing.assert_close(by_source["a.png"]["cross_attn"], _encoded(encoders[1], f"ohwx, {TAGS}"))
    plain, _ = _cache(folder, encoders, clip)
    assert plain.fingerprint != ds.fingerprint  # another text: another cache


def test_keep_tokens_keeps_the_first_tag_first_in_every_shuffled_order(encoders, tmp_path):
    folder = _folder(tmp_path, {"a": TAGS})
    clip = Recording(encoders[1])
    ds, _ = _cache(folder, encoders, clip, tag_shuffles=4, keep_tokens=1)
    assert ds.caption_lines(0) == [4] and len(set(clip.texts)) == 4
    variants = [ds.with_caption(0, k) for k in range(4)]
    for item in variants:
        tags = split_tags(item["caption"])
        assert tags[0] == "alice" and sorted(tags) == sorted(split_tags(TAGS))
        torch.testing.assert_close(item["cross_attn"], _encoded(encoders[1], item["caption"]))
    assert {item["caption"] for item in variants} == set(clip.texts)
    stream = SampleStream([1], seed=2)  # one item: every step trains it, with one of its four orders
    picked = {collate(ds, stream, [p], torch.device("cpu"))[1][0]["cross_attn"].sum().item() for p in range(40)}
    assert len(picked) == 4


def test_three_caption_lines_give_three_encodings_taken_across_epochs(encoders, tmp_path):
    folder = _folder(tmp_path, {"a": LINES, "b": "just one line"})
    ds, _ = _cache(folder, encoders, caption_lines=True)
    i = next(i for i in range(len(ds)) if ds[i]["source"] == "a.png")
    assert ds.caption_lines(i) == [1, 1, 1] and ds.caption_lines(1 - i) == [1]
    lines = [line for line in LINES.split("\n") if line]
    for k, line in enumerate(lines):
        item = ds.with_caption(i, k)
        assert item["caption"] == line
        torch.testing.assert_close(item["cross_attn"], _encoded(encoders[1], line))
    stream = SampleStream([1, 1], seed=4)
    taken = []
    for epoch in range(3):  # two samples per epoch; item a's line changes each epoch
        for p in range(2 * epoch, 2 * epoch + 2):
            if stream.item_at(p) == i:
                taken.append(collate(ds, stream, [p], torch.device("cpu"))[1][0]["cross_attn"])
    assert len(taken) == 3 and all(not torch.equal(taken[a], taken[b]) for a, b in ((0, 1), (0, 2), (1, 2)))


def test_caption_dropout_trains_the_seeded_share_with_the_empty_caption(encoders, tmp_path):
    folder = _folder(tmp_path, {f"img{n}": f"caption number {n}" for n in range(4)})
    clip = Recording(encoders[1])
    before, _ = _cache(folder, encoders, clip)
    assert not (before.cache_dir / EMPTY_CAPTION).exists()
    clip.texts.clear()
    ds, line = _cache(folder, encoders, clip, caption_dropout=0.25)
    # the same cache: dropout changes which encoding a step takes, not what is stored; only "" is encoded
    assert ds.cache_dir == before.cache_dir and clip.texts == [""] and "0 encoded" in line
    assert ds.caption_dropout == 0.25
    empty = read_empty_caption(ds.cache_dir)[0]
    torch.testing.assert_close(empty, _encoded(encoders[1], ""))
    stream, samples = SampleStream([1] * 4, seed=9), 200
    conds = [collate(ds, stream, [p], torch.device("cpu"))[1][0]["cross_attn"] for p in range(samples)]
    trained_empty = [torch.equal(c, empty) for c in conds]
    assert trained_empty == [dropped(9, 0.25, p) for p in range(samples)]  # exactly the seeded picks
    assert 0.18 * samples < sum(trained_empty) < 0.32 * samples
    _, again = _cache(folder, encoders, clip)  # back to 0: the same cache still trains every caption
    assert "0 encoded" in again and clip.texts == [""]


def test_changing_dropout_with_an_edit_copies_the_unchanged_items(encoders, tmp_path):
    folder = _folder(tmp_path, {f"img{n}": f"caption number {n}" for n in range(3)})
    clip = Recording(encoders[1])
    first, _ = _cache(folder, encoders, clip)
    (folder / "img0.txt").write_text("a new caption", encoding="utf-8")
    clip.texts.clear()
    ds, line = _cache(folder, encoders, clip, caption_dropout=0.5)
    assert ds.cache_dir != first.cache_dir  # the edit makes a new cache ...
    assert "2 copied from the previous cache, 1 encoded" in line  # ... the dropout alone does not stop the copies
    assert sorted(clip.texts) == ["", "a new caption"]


def test_a_dropout_cache_without_the_empty_caption_is_refused_before_launch(encoders, tmp_path):
    """Train Pipeline opens the cache as the ranks will (nodes/preflight.py check_cache_opens): a cache set to
    caption_dropout whose empty-caption encoding is gone is refused with the fix before any rank starts."""
    from PipeTrain.engine.config.checks import ConfigError
    from PipeTrain.nodes.preflight import check_cache_opens

    folder = _folder(tmp_path, {f"img{n}": f"caption number {n}" for n in range(2)})
    ds, _ = _cache(folder, encoders, caption_dropout=0.5)
    check_cache_opens(str(ds.cache_dir))
    (ds.cache_dir / EMPTY_CAPTION).unlink()
    with pytest.raises(ConfigError, match=r"caption_dropout 0.5 but holds no encoding of the empty caption: run "
                                          r"CacheLatents again"):
        check_cache_opens(str(ds.cache_dir))
